//! The Redis test harness: real `redis-server` processes on free ports of
//! 127.0.0.1, each with its own temporary directory and `--save ""`, killed
//! and reaped on drop. A Cluster is three masters joined with
//! `redis-cli --cluster create`.
//!
//! The binaries come from `REDIS_SERVER_BIN` / `REDIS_CLI_BIN` or from PATH.
//! Without them the Redis tests print that they were skipped and pass, unless
//! `REQUIRE_REDIS=1`, where they fail.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// Returns the started server, or returns from the test when Redis is not
/// installed (and not required).
#[macro_export]
macro_rules! redis_or_skip {
    ($start:expr) => {
        match $start {
            Some(server) => server,
            None => return,
        }
    };
}

fn find(env: &str, name: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Some(PathBuf::from(path));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

fn binaries(test: &str) -> Option<(PathBuf, PathBuf)> {
    let server = find("REDIS_SERVER_BIN", "redis-server");
    let cli = find("REDIS_CLI_BIN", "redis-cli").or_else(|| {
        let sibling = server.as_ref()?.with_file_name("redis-cli");
        sibling.is_file().then_some(sibling)
    });
    match (server, cli) {
        (Some(server), Some(cli)) => Some((server, cli)),
        _ if std::env::var("REQUIRE_REDIS").as_deref() == Ok("1") => {
            panic!(
                "{test}: REQUIRE_REDIS=1 but redis-server/redis-cli were not found (set REDIS_SERVER_BIN or install redis-server)"
            )
        }
        _ => {
            eprintln!(
                "{test}: skipped: redis-server not found (set REDIS_SERVER_BIN, or REQUIRE_REDIS=1 to fail instead)"
            );
            None
        }
    }
}

/// A free port whose cluster bus port (+10000) is free too.
fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// One `redis-server` process.
pub struct RedisServer {
    bin: PathBuf,
    cli: PathBuf,
    dir: TempDir,
    port: u16,
    extra: Vec<String>,
    child: Option<Child>,
}

impl RedisServer {
    /// A standalone server, or `None` when Redis is not installed.
    pub fn start(test: &str) -> Option<Self> {
        let (bin, cli) = binaries(test)?;
        Some(Self::spawn(bin, cli, Vec::new()))
    }

    fn spawn(bin: PathBuf, cli: PathBuf, extra: Vec<String>) -> Self {
        let mut server = Self {
            bin,
            cli,
            dir: tempfile::tempdir().unwrap(),
            port: free_port(),
            extra,
            child: None,
        };
        server.launch();
        server
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn launch(&mut self) {
        let child = Command::new(&self.bin)
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log())
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {}: {e}", self.bin.display()));
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.cmd(&["PING"]).is_ok_and(|pong| pong.trim() == "PONG") {
                return;
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!(
                    "redis-server on {} exited with {status}; log:\n{}",
                    self.port,
                    self.log_text()
                );
            }
            if Instant::now() > deadline {
                panic!(
                    "redis-server on {} did not answer within 10 s; log:\n{}",
                    self.port,
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_else(|e| format!("(no log: {e})"))
    }

    /// Run `redis-cli` against this server; its stdout.
    pub fn cmd(&self, args: &[&str]) -> Result<String, String> {
        let output = Command::new(&self.cli)
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() && !stdout.starts_with("Could not connect") {
            Ok(stdout)
        } else {
            Err(format!(
                "{stdout}{}",
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).unwrap()
    }

    /// A plain synchronous connection, for setting up and inspecting state.
    pub fn sync(&self) -> redis::Connection {
        self.client().get_connection().unwrap()
    }

    /// Kill the server (SIGKILL) and reap it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start it again on the same port, empty.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A Redis Cluster of three masters, no replicas.
#[cfg(feature = "redis-cluster")]
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

#[cfg(feature = "redis-cluster")]
impl RedisCluster {
    /// The cluster, or `None` when Redis is not installed.
    pub fn start(test: &str) -> Option<Self> {
        let (bin, cli) = binaries(test)?;
        let extra = |_: usize| {
            [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "5000",
            ]
            .map(String::from)
            .to_vec()
        };
        let nodes: Vec<RedisServer> = (0..3)
            .map(|i| RedisServer::spawn(bin.clone(), cli.clone(), extra(i)))
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let output = Command::new(&cli)
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = Self { nodes };
        cluster.wait_ok();
        Some(cluster)
    }

    fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for node in &self.nodes {
            loop {
                let info = node.cmd(&["CLUSTER", "INFO"]).unwrap_or_default();
                if info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "cluster not ok after 20 s; node {} says:\n{info}\nlog:\n{}",
                    node.port,
                    node.log_text()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    pub async fn connection(&self) -> redis::cluster_async::ClusterConnection {
        redis::cluster::ClusterClient::new(self.urls())
            .unwrap()
            .get_async_connection()
            .await
            .unwrap()
    }
}
