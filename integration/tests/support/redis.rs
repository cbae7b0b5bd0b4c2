//! The Redis test harness: real `redis-server` processes on free ports of
//! 127.0.0.1, each with its own temporary directory and `--save ""`, killed
//! and reaped on drop. A Cluster is three masters joined with
//! `redis-cli --cluster create`.
//!
//! The binaries come from `REDIS_SERVER_BIN` / `REDIS_CLI_BIN` (a path that
//! is not a file counts as missing) or from PATH. Without them the test
//! binaries mark the Redis tests ignored ([`missing`], `tests/support/trial.rs`),
//! unless `REQUIRE_REDIS=1`, where they fail.

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
        let path = PathBuf::from(path);
        return path.is_file().then_some(path);
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

/// The storage key of (`namespace`, `key`) under `prefix`, for a namespace
/// and key of printable ASCII without `%`, `{` or `}`, which the crate's
/// encoding (`src/backend/storage_key.rs`) writes as they are:
/// `tpw:api{client-7}`. For computing a key's Cluster slot before any
/// backend exists.
pub fn plain_storage_key(prefix: &str, namespace: &str, key: &[u8]) -> Vec<u8> {
    let plain = |bytes: &[u8]| {
        bytes
            .iter()
            .all(|b| (0x21..=0x7e).contains(b) && !b"%{}".contains(b))
    };
    assert!(
        plain(namespace.as_bytes()) && plain(key),
        "not plain: {namespace:?} {}",
        key.escape_ascii()
    );
    [prefix.as_bytes(), namespace.as_bytes(), b"{", key, b"}"].concat()
}

/// Why the Redis tests cannot run here (no redis-server or redis-cli), or
/// `None` when they can. The test binaries mark their trials ignored then
/// (see `tests/support/trial.rs`).
pub fn missing() -> Option<String> {
    let server = find("REDIS_SERVER_BIN", "redis-server");
    let cli = find("REDIS_CLI_BIN", "redis-cli").or_else(|| {
        let sibling = server.as_ref()?.with_file_name("redis-cli");
        sibling.is_file().then_some(sibling)
    });
    match (server, cli) {
        (Some(_), Some(_)) => None,
        (None, _) => Some(
            "redis-server not found (set REDIS_SERVER_BIN, or REQUIRE_REDIS=1 to fail instead)"
                .to_owned(),
        ),
        (_, None) => Some(
            "redis-cli not found (set REDIS_CLI_BIN, or REQUIRE_REDIS=1 to fail instead)"
                .to_owned(),
        ),
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
    /// Stopped by `signal("STOP")` and not yet continued: `masters()` asks
    /// another node (`redis-cli` would wait on it forever).
    frozen: std::sync::atomic::AtomicBool,
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
            frozen: std::sync::atomic::AtomicBool::new(false),
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

/// A Redis Cluster of three masters, with no replicas
/// ([`start`](Self::start)) or one replica each
/// ([`start_with_replicas`](Self::start_with_replicas)).
#[cfg(feature = "redis-cluster")]
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

#[cfg(feature = "redis-cluster")]
impl RedisCluster {
    /// The cluster, or `None` when Redis is not installed.
    pub fn start(test: &str) -> Option<Self> {
        Self::start_nodes(test, 0, "5000", &[])
    }

    /// Three masters with one replica each (six nodes), a node timeout of
    /// `node_timeout_ms` (how long a master is unreachable before its
    /// replica takes over), and `cluster-require-full-coverage no`: the
    /// healthy masters keep serving their slots while one master is down, so
    /// a failure on their keys is the client's, not Redis's
    /// (`TPW_FULL_COVERAGE=1`: Redis's default, `yes`).
    pub fn start_with_replicas(test: &str, node_timeout_ms: u32) -> Option<Self> {
        Self::start_nodes(
            test,
            1,
            &node_timeout_ms.to_string(),
            &[
                "--cluster-require-full-coverage",
                if std::env::var("TPW_FULL_COVERAGE").is_ok() {
                    "yes"
                } else {
                    "no"
                },
            ],
        )
    }

    fn start_nodes(test: &str, replicas: usize, node_timeout: &str, more: &[&str]) -> Option<Self> {
        let (bin, cli) = binaries(test)?;
        let extra = |_: usize| {
            let mut args = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                node_timeout,
            ]
            .map(String::from)
            .to_vec();
            args.extend(more.iter().map(|s| s.to_string()));
            args
        };
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|i| RedisServer::spawn(bin.clone(), cli.clone(), extra(i)))
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let output = Command::new(&cli)
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
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

    /// The node on `port`, to read or signal.
    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .expect("a node of the cluster")
    }

    /// The node on `port`.
    pub fn node_mut(&mut self, port: u16) -> &mut RedisServer {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of the cluster")
    }

    /// Each master's port and the slot ranges it serves, as the first node
    /// still answering sees them (`CLUSTER SLOTS`; a frozen node is not
    /// asked).
    pub fn masters(&self) -> Vec<(u16, Vec<(u16, u16)>)> {
        let Some(out) = self.nodes.iter().find_map(|n| {
            n.child.as_ref()?;
            if n.is_frozen() {
                return None;
            }
            n.cmd(&["CLUSTER", "SLOTS"]).ok()
        }) else {
            return Vec::new();
        };
        Self::parse_masters(&out)
    }

    /// The masters in `redis-cli`'s print of `CLUSTER SLOTS`.
    fn parse_masters(out: &str) -> Vec<(u16, Vec<(u16, u16)>)> {
        let mut masters: Vec<(u16, Vec<(u16, u16)>)> = Vec::new();
        // redis-cli prints each range as: start, end, then per node ip,
        // port, id (and maybe more), one value a line.
        let lines: Vec<&str> = out.lines().map(str::trim).collect();
        let mut i = 0;
        while i + 4 < lines.len() {
            let (Ok(start), Ok(end)) = (lines[i].parse::<u16>(), lines[i + 1].parse::<u16>())
            else {
                i += 1;
                continue;
            };
            if lines[i + 2] != "127.0.0.1" {
                i += 1;
                continue;
            }
            let Ok(port) = lines[i + 3].parse::<u16>() else {
                i += 1;
                continue;
            };
            match masters.iter_mut().find(|(p, _)| *p == port) {
                Some((_, ranges)) => ranges.push((start, end)),
                None => masters.push((port, vec![(start, end)])),
            }
            i += 4;
        }
        masters
    }

    pub async fn connection(&self) -> redis::cluster_async::ClusterConnection {
        redis::cluster::ClusterClient::new(self.urls())
            .unwrap()
            .get_async_connection()
            .await
            .unwrap()
    }

    /// A connection made as the crate advises
    /// (`connection::cluster_client_builder` and `connect_cluster_client`:
    /// 3 retries, 2–10 ms apart, probes of a node bounded).
    pub async fn advised_connection(
        &self,
    ) -> redis::cluster_async::ClusterConnection<tower_pinned_window_redis::connection::ClusterNode>
    {
        use tower_pinned_window_redis::connection::{
            cluster_client_builder, connect_cluster_client,
        };
        let client = cluster_client_builder(self.urls()).build().unwrap();
        connect_cluster_client(&client).await.unwrap()
    }
}

#[cfg(feature = "redis-cluster")]
#[allow(dead_code, reason = "not every test crate freezes a master")]
impl RedisCluster {
    /// [`masters`](Self::masters) as the node on `witness` sees them: a
    /// frozen node (`SIGSTOP`) would never answer, so it is not asked.
    pub fn masters_seen_by(&self, witness: u16) -> Vec<(u16, Vec<(u16, u16)>)> {
        let node = self.nodes.iter().find(|n| n.port == witness).unwrap();
        Self::parse_masters(&node.cmd(&["CLUSTER", "SLOTS"]).unwrap_or_default())
    }

    /// Wait (up to 30 s) until every master's replicas are online and hold
    /// everything it wrote (their offsets equal its own).
    /// The slot of `key`, as the Cluster computes it (`CLUSTER KEYSLOT`).
    pub fn keyslot(&self, key: &[u8]) -> u16 {
        let key = std::str::from_utf8(key).expect("storage keys are printable ASCII");
        self.nodes[0]
            .cmd(&["CLUSTER", "KEYSLOT", key])
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    pub fn wait_in_sync(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for (port, _) in self.masters() {
            let node = self.nodes.iter().find(|n| n.port == port).unwrap();
            while !node.replicas_in_sync() {
                assert!(
                    Instant::now() < deadline,
                    "the replicas of {port} never came in sync:\n{}",
                    node.cmd(&["INFO", "replication"]).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

#[allow(dead_code, reason = "not every test crate reads replication")]
impl RedisServer {
    /// A master whose replicas (at least one) are all online, at its own
    /// replication offset.
    pub fn replicas_in_sync(&self) -> bool {
        let info = self.cmd(&["INFO", "replication"]).unwrap_or_default();
        let field = |line: &str, name: &str| {
            line.split(',')
                .find_map(|f| f.strip_prefix(name)?.parse::<u64>().ok())
        };
        let Some(offset) = info.lines().find_map(|l| {
            l.trim()
                .strip_prefix("master_repl_offset:")?
                .parse::<u64>()
                .ok()
        }) else {
            return false;
        };
        let replicas: Vec<&str> = info
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("slave") && l.contains(":ip="))
            .collect();
        !replicas.is_empty()
            && replicas
                .iter()
                .all(|r| r.contains("state=online") && field(r, "offset=") == Some(offset))
    }

    /// A replica whose link to its master is up and whose sync is done.
    pub fn is_synced_replica(&self) -> bool {
        let info = self.cmd(&["INFO", "replication"]).unwrap_or_default();
        info.contains("role:slave")
            && info.contains("master_link_status:up")
            && info.contains("master_sync_in_progress:0")
    }
}

/// The name the harness's sentinels monitor their master under.
#[cfg(feature = "redis-sentinel")]
pub const SENTINEL_MASTER: &str = "tpw-master";

/// One sentinel: `redis-server <generated config> --sentinel`, with its own
/// temporary directory (the config it rewrites, its log) and free port.
#[cfg(feature = "redis-sentinel")]
pub struct SentinelServer {
    cli: PathBuf,
    dir: TempDir,
    port: u16,
    child: Option<Child>,
}

#[cfg(feature = "redis-sentinel")]
impl SentinelServer {
    fn spawn(bin: &Path, cli: &Path, master_port: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\n\
                 bind 127.0.0.1\n\
                 dir {dir}\n\
                 logfile {dir}/sentinel.log\n\
                 sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n\
                 sentinel failover-timeout {SENTINEL_MASTER} 10000\n\
                 sentinel parallel-syncs {SENTINEL_MASTER} 1\n",
                dir = dir.path().display(),
            ),
        )
        .unwrap();
        let child = Command::new(bin)
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {} --sentinel: {e}", bin.display()));
        let mut sentinel = Self {
            cli: cli.to_owned(),
            dir,
            port,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sentinel
            .cmd(&["PING"])
            .is_ok_and(|pong| pong.trim() == "PONG")
        {
            if let Some(status) = sentinel.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!(
                    "sentinel on {port} exited with {status}; log:\n{}",
                    sentinel.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "sentinel on {port} did not answer within 10 s; log:\n{}",
                sentinel.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        sentinel
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sentinel.log"))
            .unwrap_or_else(|e| format!("(no log: {e})"))
    }

    /// Run `redis-cli` against this sentinel; its stdout.
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

    /// What this sentinel says of the master (`SENTINEL MASTER`), field by
    /// field.
    pub fn master_info(&self) -> Vec<(String, String)> {
        let lines: Vec<String> = self
            .cmd(&["SENTINEL", "MASTER", SENTINEL_MASTER])
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect();
        lines
            .chunks(2)
            .filter_map(|pair| match pair {
                [k, v] => Some((k.clone(), v.clone())),
                _ => None,
            })
            .collect()
    }

    /// The master's port as this sentinel names it now.
    pub fn master_port(&self) -> Option<u16> {
        let out = self
            .cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_MASTER])
            .ok()?;
        out.lines().nth(1)?.trim().parse().ok()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kill the sentinel (SIGKILL) and reap it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(feature = "redis-sentinel")]
impl Drop for SentinelServer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[allow(dead_code, reason = "not every test crate counts script calls")]
impl RedisServer {
    /// The script calls this server has run (`EVALSHA` and `EVAL`), from
    /// `INFO commandstats`.
    pub fn script_calls(&self) -> u64 {
        self.calls(&["evalsha", "eval"])
    }

    /// How many times this server has run `commands` (lowercase names),
    /// scripts' own calls included, from `INFO commandstats`.
    pub fn calls(&self, commands: &[&str]) -> u64 {
        let stats = self.cmd(&["INFO", "commandstats"]).unwrap();
        stats
            .lines()
            .filter_map(|line| {
                let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(":calls=")?;
                commands.contains(&name).then_some(rest)
            })
            .filter_map(|rest| rest.split(',').next())
            .map(|n| n.parse::<u64>().unwrap())
            .sum()
    }
}

#[allow(dead_code, reason = "not every test crate freezes a server")]
impl RedisServer {
    /// Send `signal` (`STOP`, `CONT`, ...) to the server process, with the
    /// shell's own `kill`.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("the server is running").id();
        let status = Command::new("sh")
            .args(["-c", &format!("kill -s {signal} {pid}")])
            .status()
            .expect("sh -c kill");
        assert!(status.success(), "kill -s {signal} {pid}: {status}");
        match signal {
            "STOP" => self
                .frozen
                .store(true, std::sync::atomic::Ordering::Relaxed),
            "CONT" => self
                .frozen
                .store(false, std::sync::atomic::Ordering::Relaxed),
            _ => {}
        }
    }

    /// Whether the server was stopped (`signal("STOP")`) and not continued.
    pub fn is_frozen(&self) -> bool {
        self.frozen.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A master, its replica (`--replicaof`) and three sentinels watching them
/// with a quorum of 2, a master declared down after 1 s without an answer:
/// every process on a free port of 127.0.0.1 with its own temporary
/// directory, killed and reaped on drop.
#[cfg(feature = "redis-sentinel")]
pub struct SentinelGroup {
    /// The master as started, then its replica.
    pub servers: Vec<RedisServer>,
    pub sentinels: Vec<SentinelServer>,
}

#[cfg(feature = "redis-sentinel")]
impl SentinelGroup {
    /// The group, once the replica is in sync and every sentinel knows the
    /// replica and the two other sentinels; `None` when Redis is not
    /// installed.
    pub fn start(test: &str) -> Option<Self> {
        let (bin, cli) = binaries(test)?;
        // A replica's first sync starts at once, not after 5 s.
        let no_delay = vec!["--repl-diskless-sync-delay".to_owned(), "0".to_owned()];
        let master = RedisServer::spawn(bin.clone(), cli.clone(), no_delay.clone());
        let replica = RedisServer::spawn(
            bin.clone(),
            cli.clone(),
            [
                no_delay,
                vec![
                    "--replicaof".into(),
                    "127.0.0.1".into(),
                    master.port.to_string(),
                ],
            ]
            .concat(),
        );
        let mut group = Self {
            servers: vec![master, replica],
            sentinels: Vec::new(),
        };
        // In sync before the sentinels look: they learn of replicas from the
        // master's INFO, which they read again only every 10 s.
        group.wait_for("the replica to be in sync", Duration::from_secs(20), |g| {
            g.servers[1]
                .cmd(&["INFO", "replication"])
                .is_ok_and(|info| info.contains("master_link_status:up"))
        });
        let master_port = group.servers[0].port;
        group.sentinels = (0..3)
            .map(|_| SentinelServer::spawn(&bin, &cli, master_port))
            .collect();
        group.wait_for(
            "every sentinel to know the replica and the other sentinels",
            Duration::from_secs(30),
            |g| {
                g.sentinels.iter().all(|s| {
                    let info = s.master_info();
                    let field = |name: &str| {
                        info.iter()
                            .find(|(k, _)| k == name)
                            .map(|(_, v)| v.as_str())
                    };
                    field("flags") == Some("master")
                        && field("num-slaves") == Some("1")
                        && field("num-other-sentinels") == Some("2")
                })
            },
        );
        Some(group)
    }

    /// Poll `ready` every 20 ms; past `limit`, panic with every log.
    pub fn wait_for(&self, what: &str, limit: Duration, ready: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + limit;
        while !ready(self) {
            assert!(
                Instant::now() < deadline,
                "waited {limit:?} for {what}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every process's log, for a failure message.
    pub fn logs(&self) -> String {
        let mut logs = String::new();
        for server in &self.servers {
            logs += &format!(
                "--- redis-server {} ---\n{}\n",
                server.port,
                server.log_text()
            );
        }
        for sentinel in &self.sentinels {
            logs += &format!(
                "--- sentinel {} ---\n{}\n",
                sentinel.port,
                sentinel.log_text()
            );
        }
        logs
    }

    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(SentinelServer::url).collect()
    }

    /// The server on `port`.
    pub fn server(&self, port: u16) -> &RedisServer {
        self.servers
            .iter()
            .find(|s| s.port == port)
            .unwrap_or_else(|| panic!("no server on {port}"))
    }

    /// The server on `port`, to stop or signal it.
    pub fn server_mut(&mut self, port: u16) -> &mut RedisServer {
        self.servers
            .iter_mut()
            .find(|s| s.port == port)
            .unwrap_or_else(|| panic!("no server on {port}"))
    }

    /// The master's port as a majority of the running sentinels name it.
    pub fn master_port(&self) -> Option<u16> {
        let named: Vec<u16> = self
            .sentinels
            .iter()
            .filter(|s| s.child.is_some())
            .filter_map(SentinelServer::master_port)
            .collect();
        named
            .iter()
            .copied()
            .find(|port| named.iter().filter(|&p| p == port).count() * 2 > self.sentinels.len())
    }
}

/// Scenarios that run the same way on a standalone server and on a Cluster:
/// each takes a connection, builds its own backends under its own prefix,
/// and inspects Redis with plain commands on that connection.
pub mod cases {
    use std::collections::{BTreeMap, BTreeSet};
    use std::time::Duration;

    use http::{HeaderValue, Request, StatusCode};
    use redis::aio::ConnectionLike;
    use tower::{Layer, ServiceExt};
    use tower_pinned_window::backend::Backend;
    use tower_pinned_window::key::Key;
    use tower_pinned_window::{Quota, RateLimitLayer};
    use tower_pinned_window_redis::RedisBackend;

    use crate::support::http::{Body, ok_service};

    fn quota(limit: u64, window: Duration) -> Quota {
        Quota::new(limit, window).unwrap()
    }

    async fn get<C: ConnectionLike + Clone>(con: &C, key: &[u8]) -> Option<i64> {
        redis::cmd("GET")
            .arg(key)
            .query_async(&mut con.clone())
            .await
            .unwrap()
    }

    async fn pttl<C: ConnectionLike + Clone>(con: &C, key: &[u8]) -> i64 {
        redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut con.clone())
            .await
            .unwrap()
    }

    async fn exists<C: ConnectionLike + Clone>(con: &C, key: &[u8]) -> bool {
        let n: i64 = redis::cmd("EXISTS")
            .arg(key)
            .query_async(&mut con.clone())
            .await
            .unwrap();
        n == 1
    }

    fn request(key: &[u8]) -> Request<Body> {
        Request::builder()
            .header("x-client", HeaderValue::from_bytes(key).unwrap())
            .body(String::new())
            .unwrap()
    }

    /// The victim's keys, and keys an attacker crafts to reach the victim's
    /// counters: another quota's name, another layer's name, braces of every
    /// sort (the Cluster hash tag), escapes, the digest of a long key.
    pub fn adversarial_keys() -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        let long_victim = [b"victim-".as_slice(), &[b'l'; 70]].concat();
        let digest = Key::new(&long_victim).as_bytes().to_vec();
        let victims = vec![b"victim".to_vec(), long_victim];
        let attackers: Vec<Vec<u8>> = [
            b"1/3600000ms:victim".as_slice(),
            b":1/3600000ms:victim",
            b"v2:victim",
            b":v2:victim",
            b":victim",
            b"{victim}",
            b"}victim",
            b"victim}",
            b"{victim",
            b"}{victim}",
            b"1/3600000ms{victim}",
            b":1/3600000ms{victim}",
            b"%7Bvictim%7D",
            b"%victim",
            b"%",
            b"victim%",
            b"victim\t",
            b"victim ",
            b"\xffvictim",
        ]
        .iter()
        .map(|k| k.to_vec())
        .chain([digest.clone(), digest[..64].to_vec()])
        .collect();
        (victims, attackers)
    }

    /// Layers whose counter names collide under a naive `name:key` join:
    /// `api` with its hourly `also` quota (`api:1/3600000ms`), `api:v2`,
    /// `login` and `login:v2`; each keyed by the client-chosen `x-client`
    /// header, all on one backend under `prefix`.
    ///
    /// An attacker floods every layer with keys crafted to name the victim's
    /// counters; then the victim's first request on every layer still gets
    /// 200, and every counter in Redis belongs to the client that was
    /// counted in it, holding exactly that client's hits. Returns the
    /// storage keys of the victim's counters, for slot checks on a Cluster.
    pub async fn client_chosen_keys_reach_no_other_counter<C>(
        con: C,
        prefix: &str,
        list_keys: impl Fn() -> Vec<Vec<u8>>,
    ) -> Vec<Vec<u8>>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let store = RedisBackend::builder(con.clone())
            .prefix(prefix)
            .deny_cache(0)
            .build();
        let minute = quota(1, Duration::from_secs(60));
        let hour = quota(1, Duration::from_secs(3600));
        let layer = |name: &str, also: bool| {
            let mut layer = RateLimitLayer::try_new(name, minute).unwrap();
            if also {
                layer = layer.also(hour);
            }
            layer
                .key(http::HeaderName::from_static("x-client"))
                .backend(store.clone())
                .layer(ok_service())
        };
        // (layer name, its counters' names)
        let layers = [
            ("api", vec!["api", "api:1/3600000ms"]),
            ("api:v2", vec!["api:v2"]),
            ("login", vec!["login"]),
            ("login:v2", vec!["login:v2"]),
        ];
        let services: Vec<_> = layers
            .iter()
            .map(|(name, counters)| (counters.clone(), layer(name, counters.len() > 1)))
            .collect();
        let (victims, attackers) = adversarial_keys();
        const ATTACKS: usize = 3;
        for (_, svc) in &services {
            for key in &attackers {
                for _ in 0..ATTACKS {
                    svc.clone().oneshot(request(key)).await.unwrap();
                }
            }
        }
        let mut victim_keys = Vec::new();
        for (counters, svc) in &services {
            for victim in &victims {
                for namespace in counters {
                    let stored = store.storage_key(namespace, &Key::new(victim));
                    assert!(
                        !exists(&con, &stored).await,
                        "{} was touched by the attack",
                        stored.escape_ascii()
                    );
                    victim_keys.push(stored);
                }
                let res = svc.clone().oneshot(request(victim)).await.unwrap();
                assert_eq!(
                    res.status(),
                    StatusCode::OK,
                    "{counters:?}: the victim {}'s first request",
                    victim.escape_ascii()
                );
            }
        }
        // Every counter is one client's on one counter name, with exactly
        // that client's hits: ATTACKS for an attacker's key, 1 for a victim.
        // Keyed by the storage key of each (counter name, key) pair: two
        // different pairs never share one.
        let mut pairs = BTreeSet::new();
        let mut want = BTreeMap::new();
        for (counters, _) in &services {
            for namespace in counters {
                let clients = attackers
                    .iter()
                    .map(|key| (key, ATTACKS as i64))
                    .chain(victims.iter().map(|key| (key, 1)));
                for (key, count) in clients {
                    let key = Key::new(key);
                    pairs.insert((namespace.to_string(), key.as_bytes().to_vec()));
                    want.insert(store.storage_key(namespace, &key), count);
                }
            }
        }
        assert_eq!(
            want.len(),
            pairs.len(),
            "two (counter name, key) pairs share a storage key"
        );
        let mut got = BTreeMap::new();
        for stored in list_keys() {
            let count = get(&con, &stored).await.unwrap();
            assert!(pttl(&con, &stored).await > 0, "{}", stored.escape_ascii());
            got.insert(stored, count);
        }
        assert_eq!(got.len(), want.len(), "one counter per (counter name, key)");
        assert_eq!(got, want);
        let distinct: BTreeSet<&Vec<u8>> = victim_keys.iter().collect();
        assert_eq!(distinct.len(), victim_keys.len());
        victim_keys
    }

    /// A denial from the local deny cache was not counted in Redis: its
    /// refund changes nothing, not even the cache. A refund of a counted hit
    /// drops the key from the cache, so the next hit asks Redis again.
    pub async fn deny_cache_hits_are_never_refunded<C>(con: C, prefix: &str)
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let store = RedisBackend::builder(con.clone()).prefix(prefix).build();
        let one = quota(1, Duration::from_secs(60));
        let key = Key::new("k");
        let stored = store.storage_key("n", &key);
        let admitted = store.hit("n", &key, one).await.unwrap();
        let over = store.hit("n", &key, one).await.unwrap();
        assert_eq!((admitted.count, over.count), (1, 2));
        assert!(over.deadline.is_some(), "counted in Redis");
        let cached = store.hit("n", &key, one).await.unwrap();
        assert_eq!((cached.count, cached.deadline), (2, None), "from the cache");
        assert_eq!(get(&con, &stored).await, Some(2), "the cache sent nothing");
        assert!(!store.refund("n", &key, &cached).await.unwrap());
        assert_eq!(get(&con, &stored).await, Some(2));
        assert_eq!(
            store.hit("n", &key, one).await.unwrap().deadline,
            None,
            "still denied from the cache"
        );
        // The counted denial is taken back; the cache forgets the key.
        assert!(store.refund("n", &key, &over).await.unwrap());
        assert_eq!(get(&con, &stored).await, Some(1));
        let asked = store.hit("n", &key, one).await.unwrap();
        assert_eq!(asked.count, 2, "counted in Redis again");
        assert_eq!(asked.deadline, admitted.deadline);
    }
}

/// A server (or Cluster, or Sentinel group) shared by the trials of one test
/// binary: started by the first trial that asks, killed when the binary's
/// last handle is dropped (after the trials ran: `trial::run`).
pub struct Shared<T> {
    cell: std::sync::OnceLock<T>,
    start: fn() -> Option<T>,
}

impl<T> Shared<T> {
    pub fn new(start: fn() -> Option<T>) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            cell: std::sync::OnceLock::new(),
            start,
        })
    }

    /// The started server. Only trials that are not ignored call it, so
    /// Redis is there.
    pub fn get(&self) -> &T {
        self.cell.get_or_init(|| {
            (self.start)().expect("redis-server was found when the trials were listed")
        })
    }
}
