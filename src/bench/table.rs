//! What `plexus bench` prints: the step table, the data-parallel table, and the paired topology
//! comparison with each topology's own cost and the bounds a fused n-stream update could reach.

/// The `plexus bench` table: one row per case (step time with its p10–p90, throughput, memory,
/// parameters, achieved GFLOP/s and MFU).
pub fn print_bench(rows: &[super::BenchRow]) {
    println!(
        "{:<30} {:>5} {:>10} {:>17} {:>12} {:>9} {:>9} {:>10} {:>8} {:>6}",
        "case", "depth", "ms/step", "(p10–p90)", "samples/s", "rss MB", "act MB", "params", "GFLOP/s", "MFU"
    );
    for r in rows {
        println!(
            "{:<30} {:>5} {:>10.2} {:>17} {:>12.1} {:>9.0} {:>9.1} {:>10} {:>8.2} {:>5.1}%",
            r.case,
            r.depth,
            r.ms[0],
            format!("({:.2}–{:.2})", r.ms[1], r.ms[2]),
            r.samples_per_s,
            r.peak_rss_mb,
            r.act_mem_mb,
            r.params,
            r.achieved_gflops(),
            100.0 * r.achieved_gflops() / r.peak_gflops
        );
        if let (Some(spec), Some(mfu)) = (r.spec_gflops, r.mfu_spec()) {
            println!(
                "{:<30} MFU {:.1} % of the GPU's data-sheet dense peak ({:.0} TFLOP/s); the column above is against \
                 the matmul rate measured here ({:.0} TFLOP/s)",
                "",
                100.0 * mfu,
                spec / 1e3,
                r.peak_gflops / 1e3
            );
        }
        if r.peak_gpu_mb.is_finite() {
            println!("{:<30} GPU memory: peak {:.0} MiB allocated during the timed steps", "", r.peak_gpu_mb);
        }
        if let Some([f, b, o]) = r.phase_ms {
            println!("{:<30} profile: forward + loss {f:.2} ms, backward {b:.2} ms, optimizer {o:.2} ms", "");
            if let Some(faults) = r.page_faults_per_step {
                println!(
                    "{:<30} page faults per timed step: {faults:.0} (host memory touched afresh; plexus doctor shows \
                     the malloc settings)",
                    ""
                );
            }
        }
        if let Some(k) = &r.kernels {
            for line in k.table().lines() {
                println!("{:<30} {line}", "");
            }
        }
        if let Some(ops) = &r.ops {
            let shown = if std::env::var_os("PLEXUS_OPS_ALL").is_some() { usize::MAX } else { 10 };
            let top: Vec<String> = ops.by_name.iter().take(shown).map(|(n, c)| format!("{n} {c}")).collect();
            println!(
                "{:<30} operators per step: {} that do work (≈ GPU kernel launches), {} views/allocations; most: {}",
                "",
                ops.kernels,
                ops.metadata,
                top.join(", ")
            );
            let total = ops.total_ms();
            let slowest: Vec<String> = ops
                .ms_by_name
                .iter()
                .take(shown)
                .map(|(n, ms)| format!("{n} {ms:.1} ms ({:.0} %)", 100.0 * ms / total.max(1e-9)))
                .collect();
            println!(
                "{:<30} time in those operators, one step under the counter: {total:.1} ms; longest: {}",
                "",
                slowest.join(", ")
            );
            let mb = |b: u64| b as f64 / 1e6;
            let w = ops.bytes;
            let writers: Vec<String> =
                ops.f32_bytes_by_name.iter().take(shown).map(|(n, b)| format!("{n} {:.1}", mb(*b))).collect();
            println!(
                "{:<30} bytes those operators wrote: fp32 {:.1} MB, bf16/fp16 {:.1} MB, other {:.1} MB, and read at \
                 most {:.1} MB (the fused AdamW step's updates not included); fp32 MB by operator: {}",
                "",
                mb(w.f32),
                mb(w.half),
                mb(w.other),
                mb(w.read),
                writers.join(", ")
            );
        }
    }
}

/// The `plexus bench --nproc` table: the data-parallel step and its all-reduce.
pub fn print_dist_bench(r: &super::DistBenchRow) {
    println!(
        "{:<24} {:>5} {:>7} {:>6} {:>10} {:>10} {:>10} {:>12} {:>12} {:>9}",
        "case", "procs", "backend", "batch", "ms/step", "p10", "p90", "samples/s", "all-reduce", "share"
    );
    println!(
        "{:<24} {:>5} {:>7} {:>6} {:>10.2} {:>10.2} {:>10.2} {:>12.1} {:>9.2} ms {:>8.1}%",
        r.case,
        r.world_size,
        r.backend,
        r.batch,
        r.ms[0],
        r.ms[1],
        r.ms[2],
        r.samples_per_s,
        r.allreduce_ms,
        100.0 * r.allreduce_share()
    );
    println!("gradient all-reduced per step and rank: {:.2} MiB", r.gradient_bytes as f64 / (1u64 << 20) as f64);
}

/// The header of `plexus bench --compare`'s CSV rows ([`print_compare`]).
pub const COMPARE_CSV_HEADER: &str = "case,topology,ms_median,overhead_pct,overhead_p10,overhead_p90,act_mem_mb,\
traffic_bound_pct,flop_bound_pct,kernels_per_step";

/// The `plexus bench --compare` table (paired overhead over the first topology, with the bounds a
/// fully fused n-stream update could reach); returns the rows as CSV lines for `--csv`.
pub fn print_compare(case: &str, rows: &[super::CompareRow]) -> String {
    println!(
        "{:<24} {:>10} {:>14} {:>20} {:>9} {:>14} {:>11} {:>14}",
        "topology", "ms/step", "overhead", "(p10 … p90)", "act MB", "traffic bound", "FLOP bound", "kernels/step"
    );
    let mut text = String::new();
    for r in rows {
        let [m, lo, hi] = r.overhead_pct;
        // The bounds: the least overhead a fully fused n-stream update could have, from the bytes it
        // must move and from the FLOPs it must compute.
        let bound = r.traffic_bound_pct.map(|b| format!("≥ {b:+.1}%")).unwrap_or_default();
        let flop_bound = r.flop_bound_pct.map(|b| format!("≥ {b:+.1}%")).unwrap_or_default();
        let kernels = r.kernels.map(|k| k.to_string()).unwrap_or_default();
        println!(
            "{:<24} {:>10.2} {:>13.1}% {:>20} {:>9.1} {:>14} {:>11} {:>14}",
            r.label,
            r.ms,
            m,
            format!("({lo:+.1}% … {hi:+.1}%)"),
            r.act_mem_mb,
            bound,
            flop_bound,
            kernels
        );
        let bound_csv = r.traffic_bound_pct.map(|b| format!("{b:.3}")).unwrap_or_default();
        let flop_bound_csv = r.flop_bound_pct.map(|b| format!("{b:.3}")).unwrap_or_default();
        text += &format!(
            "{case},{},{:.4},{m:.3},{lo:.3},{hi:.3},{:.2},{bound_csv},{flop_bound_csv},{kernels}\n",
            r.label, r.ms, r.act_mem_mb
        );
    }
    print_topology_traffic(rows);
    print_topology_cost(rows);
    text
}

/// On the CPU: the bytes each topology's step writes and reads more than the first one's, per unit,
/// beside the least its stream update must move more than residual's (the traffic bound's bytes):
/// how far its operators are from what its connection needs. Under `PLEXUS_FUSED_KERNELS=cuda-host`
/// the operators are a GPU step's.
fn print_topology_traffic(rows: &[super::CompareRow]) {
    let Some(first) = rows.first().and_then(|r| r.op_bytes) else { return };
    let mb = |b: f64| b / 1e6;
    println!(
        "\nbytes one step's operators move, per unit, more than {}'s (counted on the CPU{}), against the least the \
         stream update must move more than residual's:",
        rows[0].label,
        if crate::native::setting::gpu_paths_on_cpu() { ", on a GPU step's paths" } else { "" }
    );
    println!(
        "{:<24} {:>16} {:>16} {:>16} {:>16}",
        "topology", "fp32 written MB", "bf16 written MB", "read MB (≤)", "bound MB"
    );
    for r in rows {
        let Some(b) = r.op_bytes else { continue };
        let per_unit = |x: u64, y: u64| mb((x as f64 - y as f64) / r.units.max(1) as f64);
        println!(
            "{:<24} {:>16.2} {:>16.2} {:>16.2} {:>16}",
            r.label,
            per_unit(b.f32, first.f32),
            per_unit(b.half, first.half),
            per_unit(b.read, first.read),
            if r.bound_bytes_per_unit > 0 {
                format!("{:.2}", mb(r.bound_bytes_per_unit as f64))
            } else {
                String::new()
            }
        );
    }
}

/// With `--profile`: what each topology's own kernels (GPU) or operators (CPU) cost in one eager
/// step, forward and backward, beside the traffic bound's time of its stream update per phase.
fn print_topology_cost(rows: &[super::CompareRow]) {
    use super::kernel_profile::Category;
    if rows.iter().all(|r| r.kernel_profile.is_none()) {
        return;
    }
    let gpu = rows.iter().filter_map(|r| r.kernel_profile.as_ref()).any(|p| p.gpu);
    println!(
        "\ntopology-own {} in one eager step (the topology's code between units; --profile), against the \
         least its stream update must move:",
        if gpu { "GPU kernel time" } else { "CPU operator time" }
    );
    println!(
        "{:<24} {:>10} {:>12} {:>12} {:>9} {:>16} {:>16}",
        "topology", "step ms", "own fwd ms", "own bwd ms", "launches", "bound fwd ms", "bound bwd ms"
    );
    for r in rows {
        let Some(p) = &r.kernel_profile else { continue };
        let own = p.get(Category::TopologyOwn);
        let (bf, bb) = match r.traffic_bound_ms {
            Some([f, b]) => (format!("{f:.3}"), format!("{b:.3}")),
            None => (String::new(), String::new()),
        };
        println!(
            "{:<24} {:>10.3} {:>12.3} {:>12.3} {:>9} {:>16} {:>16}",
            r.label,
            p.total_ms(),
            own.ms - own.backward_ms,
            own.backward_ms,
            own.launches,
            bf,
            bb
        );
    }
}
