//! The epoch ticker: a thread that advances the engine's epoch every tick,
//! so a guest's wall-clock deadline (a number of epochs) means time.

use std::fmt;
use std::io;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use wasmtime::Engine;

/// Stops (and joins) its thread when dropped.
pub(crate) struct EpochTicker {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for EpochTicker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EpochTicker").finish_non_exhaustive()
    }
}

impl EpochTicker {
    pub(crate) fn start(engine: Engine, tick: Duration) -> io::Result<EpochTicker> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = thread::Builder::new()
            .name("rewind-policy-epoch".into())
            .spawn(move || {
                // Dropping the sender wakes the thread at once with `Disconnected`.
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(tick) {
                    engine.increment_epoch();
                }
            })?;
        Ok(EpochTicker {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // The ticker cannot panic; if it did, there is nothing to add.
            let _ = thread.join();
        }
    }
}
