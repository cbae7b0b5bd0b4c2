//! A TCP proxy on 127.0.0.1 in front of a real server (Redis, PostgreSQL)
//! that forwards every byte both ways, and drops one reply when told: the
//! server's next bytes, on any connection, are thrown away and that
//! connection is closed on both sides. The request has reached the server
//! and run there; only its answer is lost, as when a connection drops
//! between a call and its reply.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The proxy; it stops when dropped.
pub struct DropReply {
    port: u16,
    state: Arc<State>,
    accept: JoinHandle<()>,
}

#[derive(Default)]
struct State {
    armed: AtomicBool,
    dropped: AtomicU64,
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

    /// The server's next reply is dropped, and its connection closed.
    pub fn drop_next_reply(&self) {
        self.state.armed.store(true, Ordering::SeqCst);
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
    let up = tokio::io::copy(&mut client_read, &mut server_write);
    let down = async {
        let mut buf = vec![0; 64 * 1024];
        loop {
            let n = server_read.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(());
            }
            if state.armed.swap(false, Ordering::SeqCst) {
                state.dropped.fetch_add(1, Ordering::SeqCst);
                return Ok(());
            }
            client_write.write_all(&buf[..n]).await?;
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}
