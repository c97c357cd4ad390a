//! Tests of `plexus::native`, the C++ layer: CUDA facts, matmul precision, c10d process groups.
//!
//! On a machine without a GPU the CUDA queries must fail cleanly (an `Err`, no crash).
//!
//! Process-group tests run rank 0 in the test process and the other rank in a child: this same test
//! binary re-executed with only [`child_rank`] selected and `PLEXUS_NATIVE_CHILD` naming its role.
//! Everything is on 127.0.0.1 with a port the OS just handed out, and timeouts of a few seconds.
use plexus::native::{self, process_group::Backend, process_group::ProcessGroup};
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tch::{Kind, Tensor};

const CHILD_ENV: &str = "PLEXUS_NATIVE_CHILD";
const PORT_ENV: &str = "PLEXUS_NATIVE_PORT";
const TIMEOUT: Duration = Duration::from_secs(5);
/// How much later than the timeout a failure may surface (process start, a loaded 2-core machine).
const SLACK: Duration = Duration::from_secs(15);

#[test]
fn cuda_built_matches_the_libtorch_build() {
    // build.rs compiles the CUDA parts exactly when libtorch is a CUDA build (libtorch_cuda.so).
    assert_eq!(native::cuda::cuda_built(), native::BUILT_WITH_CUDA);
}

#[test]
fn cuda_queries_fail_cleanly_without_a_device() {
    if tch::Cuda::device_count() > 0 {
        let info = native::cuda::cuda_device_info(0).expect("device 0 exists");
        assert!(!info.name.is_empty() && info.total_memory > 0 && info.multiprocessors > 0, "{info:?}");
        assert!(info.major >= 3, "{info:?}");
        native::cuda::cuda_memory_stats(0).expect("stats of device 0");
        native::cuda::cuda_reset_peak_memory(0).expect("reset peaks of device 0");
        assert!(native::cuda::cuda_driver_version().unwrap() >= 10000);
        assert!(native::cuda::cuda_runtime_version().unwrap() >= 10000);
        return;
    }
    let e = native::cuda::cuda_device_info(0).expect_err("no CUDA device here");
    eprintln!("cuda_device_info(0): {e}");
    let e = native::cuda::cuda_memory_stats(0).expect_err("no CUDA device here");
    eprintln!("cuda_memory_stats(0): {e}");
    assert!(native::cuda::cuda_reset_peak_memory(0).is_err());
    assert!(native::cuda::cuda_device_info(usize::MAX).is_err());
    // Without a driver the driver version is an error; the runtime version is known whenever
    // libtorch is a CUDA build (the runtime library ships with the wheel).
    let (driver, runtime) = (native::cuda::cuda_driver_version(), native::cuda::cuda_runtime_version());
    eprintln!("driver: {:?}, runtime: {:?}", driver.map_err(|e| e.to_string()), runtime.map_err(|e| e.to_string()));
    if native::cuda::cuda_built() {
        assert!(native::cuda::cuda_runtime_version().unwrap() >= 10000);
    } else {
        assert!(native::cuda::cuda_runtime_version().is_err());
    }
}

#[test]
fn float32_matmul_precision_round_trips() {
    let before = native::cuda::float32_matmul_precision();
    assert!(["highest", "high", "medium"].contains(&before.as_str()), "{before}");
    native::cuda::set_float32_matmul_precision("high").unwrap();
    assert_eq!(native::cuda::float32_matmul_precision(), "high");
    native::cuda::set_float32_matmul_precision("medium").unwrap();
    assert_eq!(native::cuda::float32_matmul_precision(), "medium");
    assert!(native::cuda::set_float32_matmul_precision("fast").is_err());
    assert_eq!(native::cuda::float32_matmul_precision(), "medium");
    native::cuda::set_float32_matmul_precision("highest").unwrap();
    assert_eq!(native::cuda::float32_matmul_precision(), "highest");
}

/// A port nobody listens on right now (the OS picks it; it is released before use).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn spawn_child(role: &str, port: u16) -> Child {
    Command::new(std::env::current_exe().unwrap())
        // The test's name in this binary: its module's path without the crate (`native::child_rank`).
        .args(["--exact", &format!("{}::child_rank", module_path!().split_once("::").map_or("", |p| p.1))])
        .args(["--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role)
        .env(PORT_ENV, port.to_string())
        .stdin(Stdio::piped())
        .spawn()
        .unwrap()
}

fn join(rank: usize, port: u16) -> Result<ProcessGroup, native::NativeError> {
    ProcessGroup::new(Backend::Gloo, "127.0.0.1", port, rank, 2, TIMEOUT)
}

fn assert_close(a: &Tensor, b: &Tensor) {
    assert!(a.allclose(b, 1e-6, 1e-6, false), "{a} != {b}");
}

/// What both ranks of a 2-process group run; panics on a wrong result.
fn collectives(pg: &ProcessGroup) {
    let r = pg.rank() as f64;
    // all_reduce: rank k contributes k+1, the sum over two ranks is 3.
    let mut t = Tensor::full([2, 3], r + 1.0, (Kind::Float, tch::Device::Cpu));
    pg.all_reduce_sum(&mut t).unwrap();
    assert_close(&t, &Tensor::full([2, 3], 3.0, (Kind::Float, tch::Device::Cpu)));

    // A bucket of shapes, one of them a strided (non-contiguous) view: each is (r+1)·base.
    let bases = [
        Tensor::arange(4, (Kind::Double, tch::Device::Cpu)),
        Tensor::arange(6, (Kind::Double, tch::Device::Cpu)).view([2, 3]),
        Tensor::arange(6, (Kind::Double, tch::Device::Cpu)).view([3, 2]).tr(),
    ];
    let mut bucket: Vec<Tensor> = bases.iter().map(|b| b * (r + 1.0)).collect();
    assert!(!bucket[2].is_contiguous());
    pg.all_reduce_sum_many(&mut bucket).unwrap();
    for (got, base) in bucket.iter().zip(&bases) {
        assert_close(got, &(base * 3.0));
    }

    // Integers too, and a tensor that requires grad (a parameter) is updated in place.
    let mut i = Tensor::from_slice(&[1i64, 2, 3]) * (pg.rank() as i64 + 1);
    pg.all_reduce_sum(&mut i).unwrap();
    assert_eq!(Vec::<i64>::try_from(&i).unwrap(), vec![3, 6, 9]);
    let mut p = Tensor::ones([3], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
    pg.all_reduce_sum(&mut p).unwrap();
    assert_close(&p.detach(), &Tensor::full([3], 2.0, (Kind::Float, tch::Device::Cpu)));

    // broadcast from each root.
    for root in 0..2 {
        let mut b = if pg.rank() == root {
            Tensor::arange(5, (Kind::Float, tch::Device::Cpu)) + root as f64
        } else {
            Tensor::zeros([5], (Kind::Float, tch::Device::Cpu))
        };
        pg.broadcast(&mut b, root).unwrap();
        assert_close(&b, &(Tensor::arange(5, (Kind::Float, tch::Device::Cpu)) + root as f64));
    }
    assert!(pg.broadcast(&mut t, 2).is_err());
    pg.barrier().unwrap();
}

/// The child side of the process-group tests; does nothing in a normal test run.
#[test]
fn child_rank() {
    let Ok(role) = std::env::var(CHILD_ENV) else { return };
    let port: u16 = std::env::var(PORT_ENV).unwrap().parse().unwrap();
    match role.as_str() {
        "collectives" => collectives(&join(1, port).unwrap()),
        "exit_midway" => {
            // One collective, then wait for rank 0's go and exit without leaving the group.
            let pg = join(1, port).unwrap();
            let mut t = Tensor::ones([4], (Kind::Float, tch::Device::Cpu));
            pg.all_reduce_sum(&mut t).unwrap();
            std::io::stdin().read_line(&mut String::new()).unwrap();
            std::process::exit(0);
        }
        other => panic!("unknown child role {other}"),
    }
}

#[test]
fn gloo_all_reduce_broadcast_barrier_across_two_processes() {
    assert!(native::process_group::gloo_built());
    let port = free_port();
    let mut child = spawn_child("collectives", port);
    let pg = join(0, port).unwrap();
    assert_eq!((pg.rank(), pg.world_size(), pg.backend()), (0, 2, Backend::Gloo));
    collectives(&pg);
    assert!(child.wait().unwrap().success(), "rank 1 failed");
}

#[test]
fn gloo_group_of_one_and_bad_arguments() {
    let port = free_port();
    let pg = ProcessGroup::new(Backend::Gloo, "127.0.0.1", port, 0, 1, TIMEOUT).unwrap();
    let mut t = Tensor::from_slice(&[1.5f32, -2.0]);
    pg.all_reduce_sum(&mut t).unwrap();
    assert_close(&t, &Tensor::from_slice(&[1.5f32, -2.0]));
    pg.all_reduce_sum_many(&mut []).unwrap();
    let mut mixed =
        [Tensor::ones([2], (Kind::Float, tch::Device::Cpu)), Tensor::ones([2], (Kind::Double, tch::Device::Cpu))];
    // A collective's error names the collective and the rank, and keeps the C++ side's kind.
    let e = pg.all_reduce_sum_many(&mut mixed).unwrap_err();
    assert!(
        matches!(&e, native::NativeError::Collective { op: "all_reduce", rank: 0, error, .. }
            if matches!(**error, native::NativeError::Failed(_))),
        "{e:?}"
    );
    assert!(e.to_string().contains("dtype"), "{e}");
    pg.barrier().unwrap();
    drop(pg);

    for (rank, world) in [(0, 0), (2, 2), (5, 1)] {
        let e = ProcessGroup::new(Backend::Gloo, "127.0.0.1", port, rank, world, TIMEOUT).unwrap_err();
        eprintln!("rank {rank} of {world}: {e}");
        assert!(matches!(e, native::NativeError::InvalidArgument(_)), "refused before any C++ runs: {e:?}");
    }
    assert!(matches!(
        ProcessGroup::new(Backend::Gloo, "127.0.0.1", 0, 0, 1, TIMEOUT),
        Err(native::NativeError::InvalidArgument(_))
    ));
    // NCCL: not compiled in (this machine's wheel lacks CUDA headers), or compiled but no GPU.
    if !native::process_group::nccl_built() {
        let e = ProcessGroup::new(Backend::Nccl, "127.0.0.1", port, 0, 1, TIMEOUT).unwrap_err().to_string();
        eprintln!("NCCL: {e}");
        assert!(e.contains("without NCCL"), "{e}");
    } else if tch::Cuda::device_count() == 0 {
        let e = ProcessGroup::new(Backend::Nccl, "127.0.0.1", port, 0, 1, TIMEOUT).unwrap_err().to_string();
        eprintln!("NCCL: {e}");
        assert!(e.contains("CUDA device"), "{e}");
    }
}

#[test]
fn gloo_port_in_use_is_an_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let e = ProcessGroup::new(Backend::Gloo, "127.0.0.1", port, 0, 1, TIMEOUT).unwrap_err().to_string();
    eprintln!("port in use: {e}");
    assert!(e.contains("rendezvous"), "{e}");
}

#[test]
#[ignore = "slow tier: waits out a rendezvous timeout"]
fn gloo_peer_that_never_joins_times_out() {
    let timeout = Duration::from_secs(2);
    // Rank 0 waits for rank 1 at its store.
    let start = Instant::now();
    let e = ProcessGroup::new(Backend::Gloo, "127.0.0.1", free_port(), 0, 2, timeout).unwrap_err().to_string();
    eprintln!("rank 0 alone after {:?}: {e}", start.elapsed());
    assert!(start.elapsed() >= timeout && start.elapsed() < timeout + SLACK, "{:?}", start.elapsed());
    // Rank 1 finds no store to connect to.
    let start = Instant::now();
    let e = ProcessGroup::new(Backend::Gloo, "127.0.0.1", free_port(), 1, 2, timeout).unwrap_err().to_string();
    eprintln!("rank 1 alone after {:?}: {e}", start.elapsed());
    assert!(start.elapsed() < timeout + SLACK, "{:?}", start.elapsed());
}

#[test]
fn gloo_peer_exiting_midway_is_an_error_not_a_hang() {
    let port = free_port();
    let mut child = spawn_child("exit_midway", port);
    let pg = join(0, port).unwrap();
    let mut t = Tensor::ones([4], (Kind::Float, tch::Device::Cpu));
    pg.all_reduce_sum(&mut t).unwrap();
    assert_close(&t, &Tensor::full([4], 2.0, (Kind::Float, tch::Device::Cpu)));
    // Let rank 1 exit, and start the next collective right away: it must fail, not wait forever.
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let start = Instant::now();
    let e = pg.all_reduce_sum(&mut t).unwrap_err().to_string();
    eprintln!("after the peer exited, {:?}: {e}", start.elapsed());
    assert!(start.elapsed() < TIMEOUT + SLACK, "{:?}", start.elapsed());
    assert!(e.contains("all_reduce on rank 0 of 2"), "{e}");
    assert!(pg.barrier().is_err());
    assert!(child.wait().unwrap().success());
    let start = Instant::now();
    drop(pg);
    assert!(start.elapsed() < SLACK, "dropping a broken group took {:?}", start.elapsed());
}

/// Pinning without libtorch's deprecated device argument: with a GPU the values survive and the
/// copy is page-locked; without one it is an error, not a crash (the data thread only pins for CUDA).
#[test]
fn pin_memory_keeps_values_or_fails_cleanly() {
    let t = Tensor::arange(12, (Kind::Float, tch::Device::Cpu)).reshape([3, 4]);
    match native::process_group::pin_memory(&t) {
        Ok(p) => {
            assert!(tch::Cuda::is_available(), "pinned without a GPU");
            assert!(p.is_pinned(tch::Device::Cuda(0)));
            assert!(p.equal(&t));
            let again = native::process_group::pin_memory(&p).unwrap();
            assert_eq!(again.data_ptr(), p.data_ptr(), "an already pinned tensor is not copied again");
        }
        Err(e) => {
            assert!(!tch::Cuda::is_available(), "pinning failed with a GPU: {e:#}");
            assert!(!format!("{e:#}").is_empty());
        }
    }
}

/// The operator counter sees what libtorch runs: one kernel for an add, none for views, and the
/// backward's operators too.
#[test]
fn operators_are_counted_as_kernels_views_and_calls() {
    use plexus::native::profile::count_ops;
    use tch::{Device, Kind, Tensor};
    let a = Tensor::ones([4, 3], (Kind::Float, Device::Cpu));
    let b = Tensor::ones([4, 3], (Kind::Float, Device::Cpu));
    let (_, add) = count_ops(|| &a + &b).unwrap();
    assert_eq!((add.kernels, add.metadata), (1, 0), "{add:?}");
    // Its bytes: a [4, 3] fp32 result written, two [4, 3] fp32 operands read. A bf16 cast is a
    // `copy_` into a new bf16 tensor: 24 bytes written; its operands, the fp32 source and the
    // destination, 72 (what is read is at most the operands).
    assert_eq!((add.bytes.f32, add.bytes.half, add.bytes.read), (48, 0, 96), "{add:?}");
    let (_, cast) = count_ops(|| a.to_kind(Kind::BFloat16)).unwrap();
    assert_eq!((cast.bytes.f32, cast.bytes.half, cast.bytes.read), (0, 24, 72), "{cast:?}");
    let (_, views) = count_ops(|| a.view([3, 4]).transpose(0, 1).select(0, 1)).unwrap();
    assert_eq!(views.kernels, 0, "{views:?}");
    assert!(views.metadata >= 3, "{views:?}");
    // mul and sum forward; backward of sum (an expand, no kernel, or a fill) and of mul (a mul).
    let x = Tensor::ones([5], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let (_, fwd) = count_ops(|| (&x * 2.0).sum(Kind::Float)).unwrap();
    assert_eq!(fwd.kernels, 2, "{fwd:?}");
    let loss = (&x * 2.0).sum(Kind::Float);
    let (_, bwd) = count_ops(|| loss.backward()).unwrap();
    assert!(bwd.kernels >= 1 && bwd.calls > bwd.kernels, "{bwd:?}");
    // Not counting outside: a second count starts from zero; nesting is refused.
    let (_, again) = count_ops(|| &a + &b).unwrap();
    assert_eq!(again.kernels, 1);
    let nested = count_ops(|| count_ops(|| ()).map(|_| ()));
    assert!(nested.unwrap().0.unwrap_err().to_string().contains("already running"));
}

/// The counter is one per process: a count on a second thread while the first is open waits for
/// it (tests and benchmark threads count side by side) and each sees only its own operators; a
/// count whose closure panics does not leave the counter running.
#[test]
fn counts_on_two_threads_wait_for_each_other_and_a_panic_ends_its_count() {
    use plexus::native::{profile::count_ops, profile::trace_ops};
    use std::sync::mpsc;
    use tch::{Device, Kind, Tensor};
    let add = || {
        let a = Tensor::ones([4, 3], (Kind::Float, Device::Cpu));
        &a + &a
    };
    let (opened, wait_open) = mpsc::channel();
    let first = std::thread::spawn(move || {
        count_ops(|| {
            opened.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            (0..3).for_each(|_| drop(add()));
        })
        .unwrap()
        .1
    });
    wait_open.recv().unwrap();
    // The first count is open now: this one starts when it ends.
    let (_, second) = count_ops(add).unwrap();
    let first = first.join().unwrap();
    // `ones` is a fill kernel, the add another.
    assert_eq!((first.kernels, second.kernels), (6, 2), "{first:?}\n{second:?}");

    for _ in 0..2 {
        let panicked = std::panic::catch_unwind(|| count_ops(|| panic!("inside a count")));
        assert!(panicked.is_err());
        let panicked = std::panic::catch_unwind(|| trace_ops(|| panic!("inside a trace")));
        assert!(panicked.is_err());
    }
    assert_eq!(count_ops(add).unwrap().1.kernels, 2);
    assert_eq!(trace_ops(add).unwrap().1.len(), trace_ops(add).unwrap().1.len());
}
