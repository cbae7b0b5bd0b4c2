//! A TCP proxy on 127.0.0.1 in front of a real server (Redis, PostgreSQL)
//! that forwards every byte both ways, and drops one reply when told: the
//! server's reply is thrown away and its connection closed on both sides.
//! The request has reached the server and run there; only its answer is
//! lost, as when a connection drops between a call and its reply. It can
//! also hold replies back (a slow network), until released.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The proxy; it stops when dropped.
pub struct DropReply {
    port: u16,
    state: Arc<State>,
    accept: JoinHandle<()>,
}

/// Which reply to drop.
struct Plan {
    /// The request whose reply is dropped: the first one whose bytes hold
    /// these; `None`: whatever the server sends next.
    request: Option<Vec<u8>>,
    /// The reply ends with the server's bytes that hold these: everything
    /// the server sends up to them is dropped.
    reply_end: Option<Vec<u8>>,
}

#[derive(Default)]
struct State {
    plan: Mutex<Option<Plan>>,
    dropped: AtomicU64,
    /// Replies to the requests whose bytes hold these are held back.
    hold: Mutex<Option<Vec<u8>>>,
    released: tokio::sync::Notify,
}

fn holds(bytes: &[u8], part: &[u8]) -> bool {
    bytes.windows(part.len()).any(|w| w == part)
}

impl DropReply {
    /// A proxy to `127.0.0.1:upstream`, on a free port. Needs a tokio
    /// runtime.
    pub async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State::default());
        let shared = Arc::clone(&state);
        let upstream = SocketAddr::from(([127, 0, 0, 1], upstream));
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                tokio::spawn(pipe(client, server, Arc::clone(&shared)));
            }
        });
        Self {
            port,
            state,
            accept,
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's next bytes, on any connection, are dropped, and that
    /// connection closed.
    pub fn drop_next_reply(&self) {
        *self.state.plan.lock().unwrap() = Some(Plan {
            request: None,
            reply_end: None,
        });
    }

    /// The reply to the next request whose bytes hold `request` is
    /// dropped, every byte of it up to the server's bytes that hold
    /// `reply_end`, and then the connection closed (so the server has
    /// answered the whole request before it sees the connection go).
    pub fn drop_reply_to(&self, request: &[u8], reply_end: &[u8]) {
        *self.state.plan.lock().unwrap() = Some(Plan {
            request: Some(request.to_vec()),
            reply_end: Some(reply_end.to_vec()),
        });
    }

    /// The replies on the connection of the next request whose bytes hold
    /// `request` are held back, from then until [`release`](Self::release).
    pub fn hold_reply_to(&self, request: &[u8]) {
        *self.state.hold.lock().unwrap() = Some(request.to_vec());
    }

    /// Replies held back go on.
    pub fn release(&self) {
        *self.state.hold.lock().unwrap() = None;
        self.state.released.notify_waiters();
    }

    /// Replies dropped so far.
    pub fn dropped(&self) -> u64 {
        self.state.dropped.load(Ordering::SeqCst)
    }
}

impl Drop for DropReply {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Forwards both ways until either side closes, or a reply is dropped:
/// then both connections close (their halves are dropped here).
async fn pipe(client: TcpStream, server: TcpStream, state: Arc<State>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // This connection carries the request whose reply is dropped.
    let chosen = AtomicBool::new(false);
    // This connection's replies are held back.
    let held = AtomicBool::new(false);
    let up = async {
        let mut buf = vec![0; 64 * 1024];
        loop {
            let n = client_read.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(());
            }
            if let Some(Plan {
                request: Some(request),
                ..
            }) = &*state.plan.lock().unwrap()
                && holds(&buf[..n], request)
            {
                chosen.store(true, Ordering::SeqCst);
            }
            if let Some(request) = &*state.hold.lock().unwrap()
                && holds(&buf[..n], request)
            {
                held.store(true, Ordering::SeqCst);
            }
            server_write.write_all(&buf[..n]).await?;
        }
    };
    let down = async {
        let mut buf = vec![0; 64 * 1024];
        loop {
            let n = server_read.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(());
            }
            if held.load(Ordering::SeqCst) {
                loop {
                    let released = state.released.notified();
                    if state.hold.lock().unwrap().is_none() {
                        break;
                    }
                    released.await;
                }
                held.store(false, Ordering::SeqCst);
            }
            {
                let mut plan = state.plan.lock().unwrap();
                let drop_it = match &*plan {
                    Some(Plan { request: None, .. }) => Some(true),
                    Some(Plan {
                        reply_end: Some(end),
                        ..
                    }) if chosen.load(Ordering::SeqCst) => Some(holds(&buf[..n], end)),
                    _ => None,
                };
                match drop_it {
                    // The reply's last bytes: dropped, and the connection
                    // closed.
                    Some(true) => {
                        *plan = None;
                        state.dropped.fetch_add(1, Ordering::SeqCst);
                        return Ok(());
                    }
                    // Part of the reply: dropped.
                    Some(false) => continue,
                    None => {}
                }
            }
            client_write.write_all(&buf[..n]).await?;
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}
