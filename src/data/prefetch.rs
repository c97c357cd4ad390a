//! Batches prepared off the training thread: a worker calls `train_shard(i, rank, world)` (this
//! process's slice of batch `i`) for consecutive indices ahead of the trainer, through a bounded
//! channel.

use super::{Batch, DataSource};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

pub struct Prefetcher {
    rx: Option<Receiver<anyhow::Result<Batch>>>,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
    next: u64,
}

impl Prefetcher {
    /// Starts preparing batches `start, start+1, …` — rank `rank` of `world`'s slice of each —
    /// keeping at most `depth` ready. Host batches bound for a CUDA `device` are pinned here, on
    /// the data thread, so that the trainer's copy is asynchronous.
    pub fn new(
        source: Box<dyn DataSource>,
        start: u64,
        depth: usize,
        device: tch::Device,
        (rank, world): (usize, usize),
    ) -> Self {
        let (tx, rx) = sync_channel(depth.max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let worker = std::thread::Builder::new()
            .name("plexus-data".into())
            .spawn(move || {
                let mut i = start;
                while !flag.load(Ordering::Relaxed) {
                    let batch = source.train_shard(i, rank, world).and_then(|b| b.pinned_for(device));
                    let failed = batch.is_err();
                    // After an error the thread stops: the trainer stops at that batch.
                    if tx.send(batch).is_err() || failed {
                        break;
                    }
                    i += 1;
                }
            })
            .expect("spawn the data thread");
        Self { rx: Some(rx), stop, worker: Some(worker), next: start }
    }

    /// The next batch, in index order, or the error that preparing it met.
    pub fn next_batch(&mut self) -> anyhow::Result<Batch> {
        let index = self.next;
        self.next += 1;
        match self.rx.as_ref().expect("open").recv() {
            Ok(batch) => batch.map_err(|e| e.context(format!("preparing training batch {index}"))),
            Err(_) => anyhow::bail!("the data thread stopped before training batch {index} (it panicked; see above)"),
        }
    }

    /// Index of the batch `next_batch` will return.
    pub fn position(&self) -> u64 {
        self.next
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        drop(self.rx.take()); // unblocks a worker waiting to send
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}
