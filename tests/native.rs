//! Tests of `plexus::native`, the C++ layer (CUDA facts, matmul precision).
//!
//! On a machine without a GPU the CUDA queries must fail cleanly (an `Err`, no crash).
use plexus::native;

#[test]
fn cuda_built_matches_the_libtorch_build() {
    // build.rs compiles the CUDA parts exactly when libtorch is a CUDA build (libtorch_cuda.so).
    assert_eq!(native::cuda_built(), env!("PLEXUS_NATIVE_WITH_CUDA") == "1");
}

#[test]
fn cuda_queries_fail_cleanly_without_a_device() {
    if tch::Cuda::device_count() > 0 {
        let info = native::cuda_device_info(0).expect("device 0 exists");
        assert!(!info.name.is_empty() && info.total_memory > 0 && info.multiprocessors > 0, "{info:?}");
        assert!(info.major >= 3, "{info:?}");
        native::cuda_memory_stats(0).expect("stats of device 0");
        native::cuda_reset_peak_memory(0).expect("reset peaks of device 0");
        assert!(native::cuda_driver_version().unwrap() >= 10000);
        assert!(native::cuda_runtime_version().unwrap() >= 10000);
        return;
    }
    let e = native::cuda_device_info(0).expect_err("no CUDA device here");
    eprintln!("cuda_device_info(0): {e}");
    let e = native::cuda_memory_stats(0).expect_err("no CUDA device here");
    eprintln!("cuda_memory_stats(0): {e}");
    assert!(native::cuda_reset_peak_memory(0).is_err());
    assert!(native::cuda_device_info(usize::MAX).is_err());
    // Without a driver the driver version is an error; the runtime version is known whenever
    // libtorch is a CUDA build (the runtime library ships with the wheel).
    let (driver, runtime) = (native::cuda_driver_version(), native::cuda_runtime_version());
    eprintln!("driver: {:?}, runtime: {:?}", driver.map_err(|e| e.to_string()), runtime.map_err(|e| e.to_string()));
    if native::cuda_built() {
        assert!(native::cuda_runtime_version().unwrap() >= 10000);
    } else {
        assert!(native::cuda_runtime_version().is_err());
    }
}

#[test]
fn float32_matmul_precision_round_trips() {
    let before = native::float32_matmul_precision();
    assert!(["highest", "high", "medium"].contains(&before.as_str()), "{before}");
    native::set_float32_matmul_precision("high").unwrap();
    assert_eq!(native::float32_matmul_precision(), "high");
    native::set_float32_matmul_precision("medium").unwrap();
    assert_eq!(native::float32_matmul_precision(), "medium");
    assert!(native::set_float32_matmul_precision("fast").is_err());
    assert_eq!(native::float32_matmul_precision(), "medium");
    native::set_float32_matmul_precision("highest").unwrap();
    assert_eq!(native::float32_matmul_precision(), "highest");
}
