//! Images per second of the `imagefolder` training pipeline (read, JPEG decode, random-resized
//! crop, flip, resize), for the figures in bench/README.md:
//!
//! ```sh
//! cargo run --release --example imagefolder_rate -- DATA_ROOT [DIR] [IMAGE_SIZE] [WORKERS] [BATCHES]
//! ```
//!
//! Loads `<DATA_ROOT>/<DIR>` (default `cifar10`, the CIFAR-10 JPEG folder; train split, 10
//! classes) with `batch_size` 64, warms the page cache with 4 batches, then times `BATCHES`
//! (default 40) training batches, three times, and prints the best and median rate, total and per
//! worker.

use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.to_string());
    let root = std::path::PathBuf::from(
        args.first().ok_or_else(|| anyhow::anyhow!("usage: DATA_ROOT [DIR] [IMAGE_SIZE] [WORKERS] [BATCHES]"))?,
    );
    let (dir, size, workers, batches) = (
        arg(1, "cifar10"),
        arg(2, "32").parse::<usize>()?,
        arg(3, "1").parse::<usize>()?,
        arg(4, "40").parse::<u64>()?,
    );
    let options: serde_yaml::Mapping = serde_yaml::from_str(&format!(
        "{{dir: {dir}, eval_split: test, classes: 10, image_size: {size}, batch_size: 64, eval_samples: 64, workers: {workers}}}"
    ))?;
    let src = plexus::data::parse_at("imagefolder", &root, &options).map_err(|e| anyhow::anyhow!("{e:?}"))?.load()?;
    for i in 0..4 {
        src.train_batch(1000 + i)?;
    }
    let mut rates = Vec::new();
    for rep in 0..3u64 {
        let t = Instant::now();
        for i in 0..batches {
            src.train_batch(rep * batches + i)?;
        }
        rates.push((batches * 64) as f64 / t.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    println!(
        "imagefolder {dir} image_size {size} workers {workers}: best {:.0} images/s ({:.0} per worker), median {:.0} images/s",
        rates[2],
        rates[2] / workers as f64,
        rates[1]
    );
    Ok(())
}
