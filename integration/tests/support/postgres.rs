//! The PostgreSQL test harness.
//!
//! - [`TestSchema`]: a schema of its own on the machine's server
//!   (`TEST_DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/test`),
//!   created for one test and dropped with everything in it at the end, so
//!   runs never collide.
//! - [`PgServer`]: a private PostgreSQL for the tests that stop or crash the
//!   server (never the shared one): `initdb` into a temporary directory, a
//!   free port of 127.0.0.1, run as the `postgres` user (with `runuser` when
//!   the tests run as root, as in CI), stopped and reaped on drop. Binaries
//!   come from `PG_BIN` or the newest `/usr/lib/postgresql/*/bin`.
//!
//! Without a server (or binaries) the test binaries mark those tests ignored
//! ([`missing_server`], [`missing_binaries`], `tests/support/trial.rs`), unless
//! `REQUIRE_POSTGRES=1`, where they fail.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tempfile::TempDir;
use tower_pinned_window_postgres::deadpool_postgres::{
    Manager, ManagerConfig, Pool, RecyclingMethod, Runtime,
};
use tower_pinned_window_postgres::tokio_postgres::{self, Client, NoTls};
use tower_pinned_window_postgres::{PostgresBackend, PostgresBackendBuilder};

/// Returns the started fixture, or returns from the test when PostgreSQL is
/// not there (and not required).
#[macro_export]
macro_rules! pg_or_skip {
    ($start:expr) => {
        match $start {
            Some(fixture) => fixture,
            None => return,
        }
    };
}

pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

fn required() -> bool {
    std::env::var("REQUIRE_POSTGRES").as_deref() == Ok("1")
}

fn skip<T>(test: &str, why: &str) -> Option<T> {
    if required() {
        panic!("{test}: REQUIRE_POSTGRES=1 but {why}");
    }
    eprintln!("{test}: skipped: {why} (REQUIRE_POSTGRES=1 to fail instead)");
    None
}

/// Why the tests on the machine's PostgreSQL cannot run here (no server
/// answers at [`url`] within 5 s), or `None` when they can.
pub fn missing_server() -> Option<String> {
    let url = url();
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                match tokio::time::timeout(Duration::from_secs(5), connect(&url)).await {
                    Ok(Ok(_)) => None,
                    Ok(Err(err)) => Some(format!(
                        "no PostgreSQL at {url}: {err} (set TEST_DATABASE_URL, or REQUIRE_POSTGRES=1 to fail instead)"
                    )),
                    Err(_) => Some(format!(
                        "no PostgreSQL at {url}: timed out (set TEST_DATABASE_URL, or REQUIRE_POSTGRES=1 to fail instead)"
                    )),
                }
            })
    })
    .join()
    .unwrap()
}

/// Why the tests that start a private PostgreSQL cannot run here (no server
/// binaries), or `None` when they can.
pub fn missing_binaries() -> Option<String> {
    bin_dir().is_none().then(|| {
        "no PostgreSQL server binaries (set PG_BIN, or install postgresql; REQUIRE_POSTGRES=1 to fail instead)"
            .to_owned()
    })
}

pub fn url() -> String {
    std::env::var("TEST_DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A client for setting up and inspecting state; its connection runs on the
/// current runtime.
pub async fn connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// A pool of `size` connections to `url`, named `application_name` in
/// `pg_stat_activity` (so a test can find, and kill, its own connections).
pub fn pool(url: &str, application_name: &str, size: usize) -> Pool {
    let mut config: tokio_postgres::Config = url.parse().unwrap();
    config.application_name(application_name);
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .create_timeout(Some(Duration::from_secs(5)))
        .build()
        .unwrap()
}

static SCHEMAS: AtomicU32 = AtomicU32::new(0);

/// A schema of its own on the shared server, dropped (cascading) on drop.
pub struct TestSchema {
    pub name: String,
    pub url: String,
    pub client: Client,
}

impl TestSchema {
    /// The schema, or `None` when the server cannot be reached (and is not
    /// required).
    pub async fn create(test: &str) -> Option<Self> {
        let url = url();
        let client = match tokio::time::timeout(Duration::from_secs(5), connect(&url)).await {
            Ok(Ok(client)) => client,
            Ok(Err(err)) => return skip(test, &format!("no PostgreSQL at {url}: {err}")),
            Err(_) => return skip(test, &format!("no PostgreSQL at {url}: timed out")),
        };
        let short: String = test
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .take(36)
            .collect::<String>()
            .to_ascii_lowercase();
        let name = format!(
            "tpwt_{short}_{}_{}",
            std::process::id(),
            SCHEMAS.fetch_add(1, Ordering::Relaxed)
        );
        client
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}"
            ))
            .await
            .unwrap();
        Some(Self { name, url, client })
    }

    /// A pool of `size` connections named after this schema.
    pub fn pool(&self, size: usize) -> Pool {
        pool(&self.url, &self.name, size)
    }

    /// A builder for a backend on this schema, with its own pool.
    pub fn builder(&self) -> PostgresBackendBuilder {
        PostgresBackend::builder(self.pool(8)).schema(&self.name)
    }

    /// A backend on this schema with its own pool, its table migrated.
    pub async fn backend(&self) -> PostgresBackend {
        let backend = self.builder().build();
        backend.migrate().await.unwrap();
        backend
    }

    /// `schema.table`.
    pub fn table(&self) -> String {
        format!("{}.tpw_counters", self.name)
    }

    /// Kill every connection of this schema's pools.
    pub async fn kill_connections(&self) -> i64 {
        let row = self
            .client
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name = $1 AND pid <> pg_backend_pid()",
                &[&self.name],
            )
            .await
            .unwrap();
        row.get(0)
    }

    /// Connections of this schema's pools still open.
    pub async fn connections(&self) -> i64 {
        self.client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[&self.name],
            )
            .await
            .unwrap()
            .get(0)
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        // On a runtime of its own: this may run while the test's runtime is
        // shutting down.
        let (url, name) = (self.url.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async move {
                    let client = connect(&url).await?;
                    client
                        .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                        .await
                })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop schema {}: {dropped:?}", self.name);
        }
    }
}

/// The directory of the PostgreSQL server binaries.
fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, bin)| bin)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// A free port of 127.0.0.1.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A private PostgreSQL server, stopped and reaped on drop.
pub struct PgServer {
    bin: PathBuf,
    dir: TempDir,
    port: u16,
    as_postgres: bool,
    running: bool,
}

impl PgServer {
    /// A fresh server, or `None` when the binaries are missing (and not
    /// required).
    pub fn start(test: &str) -> Option<Self> {
        let Some(bin) = bin_dir() else {
            return skip(
                test,
                "no PostgreSQL server binaries (set PG_BIN, or install postgresql)",
            );
        };
        let dir = tempfile::tempdir().unwrap();
        let as_postgres = is_root();
        if as_postgres {
            // initdb and postgres refuse to run as root.
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(status.success(), "chown of {}", dir.path().display());
        }
        let mut server = Self {
            bin,
            dir,
            port: free_port(),
            as_postgres,
            running: false,
        };
        let data = server.data();
        server.run(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        server.launch();
        Some(server)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    /// Run one of the server's programs, as `postgres` when we are root.
    fn run(&self, program: &str, args: &[&str]) {
        let path = self.bin.join(program);
        let mut command = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&path);
            c
        } else {
            Command::new(&path)
        };
        let output = command
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("could not run {}: {e}", path.display()));
        assert!(
            output.status.success(),
            "{program} {args:?} failed: {}{}\nlog:\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            std::fs::read_to_string(self.log()).unwrap_or_default()
        );
    }

    fn launch(&mut self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100",
            self.port,
            self.dir.path().display()
        );
        let (data, log) = (self.data(), self.log());
        self.run(
            "pg_ctl",
            &[
                "-D",
                data.to_str().unwrap(),
                "-l",
                log.to_str().unwrap(),
                "-o",
                &options,
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
        self.running = true;
    }

    /// Stop the server the way a crash does (`pg_ctl stop -m immediate`:
    /// no checkpoint; the next start runs crash recovery).
    pub fn crash(&mut self) {
        if self.running {
            let data = self.data();
            self.run(
                "pg_ctl",
                &[
                    "-D",
                    data.to_str().unwrap(),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ],
            );
            self.running = false;
        }
    }

    /// Crash it and start it again on the same port.
    pub fn restart(&mut self) {
        self.crash();
        self.launch();
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if self.running {
            let data = self.data();
            let mut command = if self.as_postgres {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"])
                    .arg(self.bin.join("pg_ctl"));
                c
            } else {
                Command::new(self.bin.join("pg_ctl"))
            };
            let _ = command
                .args([
                    "-D",
                    data.to_str().unwrap(),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}
