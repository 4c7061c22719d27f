//! CPU tests of the dispatcher: argument and pointer checks before any launch, the Send + Sync
//! bound serving threads rely on, and the startup report's text.

use super::*;

fn args() -> GemmArgs {
    GemmArgs {
        a: 0x7f00_0000_0000,
        a_sf: 0,
        w: 0x7f00_0010_0000,
        w_sf: 0x7f00_0020_0000,
        y: 0x7f00_0030_0000,
        m: 1,
        n: 512,
        k: 6144,
        a_type: AType::Bf16,
        alpha: 1.0,
    }
}

#[test]
fn bad_arguments_are_refused_before_any_launch() {
    assert!(validate(&args()).is_ok());
    let check = |f: &dyn Fn(&mut GemmArgs), want: &str| {
        let mut a = args();
        f(&mut a);
        let e = validate(&a).unwrap_err().to_string();
        assert!(e.contains(want), "want {want:?} in {e}");
    };
    check(&|a| a.m = 0, "empty GEMM");
    check(&|a| a.k = 100, "multiple of the NVFP4 block size");
    check(&|a| a.n = u32::MAX, "signed 32-bit");
    check(&|a| a.w_sf = 0, "`w_sf`");
    check(&|a| a.a_type = AType::Nvfp4, "`a_sf`");
}

/// A misaligned pointer is refused before any launch (it would fault the
/// kernel and the context), naming the pointer and the alignment it needs.
#[test]
fn misaligned_pointers_are_refused_naming_the_pointer_and_its_alignment() {
    let check = |f: &dyn Fn(&mut GemmArgs), want: &[&str]| {
        let mut a = args();
        f(&mut a);
        let e = validate(&a).unwrap_err();
        assert!(matches!(e, RuntimeError::InvalidArgument(_)), "{e:?}");
        let e = e.to_string();
        for w in want {
            assert!(e.contains(w), "want {w:?} in {e}");
        }
    };
    check(&|a| a.a += 8, &["`a`", "not 16-byte aligned"]);
    check(&|a| a.a += 2, &["`a`", "16-byte"]);
    check(&|a| a.w += 4, &["`w`", "not 16-byte aligned"]);
    check(&|a| a.w_sf += 2, &["`w_sf`", "not 4-byte aligned"]);
    check(&|a| a.y += 2, &["`y`", "not 4-byte aligned", "0x7f0000300002"]);
    let w4a4 = |a: &mut GemmArgs| {
        a.a_type = AType::Nvfp4;
        a.a_sf = 0x7f00_0040_0000;
    };
    check(
        &|a| {
            w4a4(a);
            a.a_sf += 1;
        },
        &["`a_sf`", "not 4-byte aligned"],
    );
    // What the kernels need is enough: 16 B for A and W, 4 B for the scales and Y.
    let mut a = args();
    w4a4(&mut a);
    (a.a, a.w) = (a.a + 16, a.w + 48);
    (a.a_sf, a.w_sf, a.y) = (a.a_sf + 4, a.w_sf + 12, a.y + 4);
    assert!(validate(&a).is_ok());
    // W4A16 does not read `a_sf`: any value is accepted.
    let mut a = args();
    a.a_sf = 3;
    assert!(validate(&a).is_ok());
}

#[test]
fn dispatcher_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Dispatcher>();
}

#[test]
fn startup_report_reads_well() {
    let r = StartupReport {
        device: "NVIDIA H200".into(),
        family: Family::Sm90,
        table: Some("results/h200.ron".into()),
        entries: 28,
        shapes: 2,
        kernels: 9,
        compiled: 2,
        from_disk_cache: 7,
        from_memory_cache: 0,
        cache_dir: Some("/tmp/c".into()),
        compile_s: 0.5,
        load_s: 0.01,
        composite_bytes: 0,
        total_s: 0.7,
        max_m: 8192,
        workspace_bytes: 4096,
        moe_layers: vec!["grouped MoE w4a16 hidden 6144: gate_up at B = 1".into()],
        warnings: vec!["w1".into()],
    };
    let s = r.to_string();
    assert!(s.contains("9 kernels: 2 compiled, 7 from the disk cache"), "{s}");
    assert!(s.contains("warning: w1"), "{s}");
    assert!(s.contains("workspace 4096 bytes per stream for M <= 8192"), "{s}");
    assert!(!s.contains("dequantize-then-cuBLAS"), "{s}");
    assert!(s.contains("\n  grouped MoE w4a16 hidden 6144: gate_up at B = 1\n"), "{s}");
}
