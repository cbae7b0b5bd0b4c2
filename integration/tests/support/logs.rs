//! The log lines a piece of a test emits, captured by a `tracing`
//! subscriber of this thread only (so tests running beside it add none).

use std::io;
use std::sync::{Arc, Mutex};

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;

/// What the subscriber wrote, shared with the test.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Lines {
    type Writer = Lines;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// This thread's events at a level and above, captured from
/// [`start`](Self::start) until the capture is dropped.
pub struct Capture {
    lines: Lines,
    _guard: tracing::dispatcher::DefaultGuard,
}

impl Capture {
    /// Capture this thread's events at `level` and above (those of whatever
    /// is polled on this thread too, such as a current-thread runtime's
    /// tasks or a future it blocks on).
    pub fn start(level: LevelFilter) -> Self {
        let lines = Lines::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(lines.clone())
            .with_ansi(false)
            .with_max_level(level)
            .finish();
        Self {
            lines,
            _guard: subscriber.set_default(),
        }
    }

    /// The lines logged so far.
    pub fn lines(&self) -> Vec<String> {
        let text = String::from_utf8(self.lines.0.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }
}

/// Run `f` with this thread's events at `level` and above captured: its
/// result and the lines logged meanwhile.
pub fn capture<T>(level: LevelFilter, f: impl FnOnce() -> T) -> (T, Vec<String>) {
    let capture = Capture::start(level);
    let result = f();
    (result, capture.lines())
}
