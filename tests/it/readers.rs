//! The trace and golden readers on corrupted bytes: always a clean error or a valid trace,
//! never a panic. A small proptest "fuzzer" over the committed article golden.

use std::panic::{catch_unwind, AssertUnwindSafe};

use ddp_verify::evidence::golden::Golden;
use ddp_verify::evidence::Trace;
use ddp_verify::train::models;
use ddp_verify::{Error, TrainConfig};
use proptest::prelude::*;

use crate::util::repo;

#[derive(Debug, Clone)]
enum Damage {
    Truncate(usize),
    Flip { at: usize, bits: u8 },
    Splice { at: usize, bytes: Vec<u8> },
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (0usize..2000).prop_map(Damage::Truncate),
        (0usize..2000, 1u8..=255).prop_map(|(at, bits)| Damage::Flip { at, bits }),
        (0usize..2000, proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Damage::Splice { at, bytes }),
    ]
}

fn apply(mut b: Vec<u8>, d: &Damage) -> Vec<u8> {
    match d {
        Damage::Truncate(n) => b.truncate(*n % (b.len() + 1)),
        Damage::Flip { at, bits } => {
            let i = at % b.len();
            b[i] ^= bits;
        }
        Damage::Splice { at, bytes } => {
            let i = at % (b.len() + 1);
            b.splice(i..i, bytes.iter().copied());
        }
    }
    b
}

proptest! {
    #![proptest_config(crate::util::proptest_config(200))]

    #[test]
    fn a_corrupted_trace_file_is_refused_cleanly_never_a_panic(d in damage()) {
        let good = std::fs::read(repo("golden/article/ddp.safetensors")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ddp.safetensors");
        std::fs::write(&path, apply(good, &d)).unwrap();
        let result = catch_unwind(AssertUnwindSafe(|| Trace::load(&path)));
        prop_assert!(result.is_ok(), "the reader panicked on {:?}", d);
        if let Ok(Err(e)) = result {
            prop_assert!(matches!(e, Error::BadFile { .. }), "{e}");
            prop_assert_eq!(e.exit().code(), 2);
        }
    }

    #[test]
    fn a_corrupted_golden_header_is_refused_cleanly_never_a_panic(d in damage()) {
        let src = repo("golden/article");
        let dir = tempfile::tempdir().unwrap();
        for f in ["accumulation.safetensors", "ddp.safetensors", "config.json"] {
            std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
        }
        let header = std::fs::read(src.join("config.json")).unwrap();
        std::fs::write(dir.path().join("config.json"), apply(header, &d)).unwrap();
        let result = catch_unwind(AssertUnwindSafe(|| Golden::load(dir.path(), &TrainConfig::article(), &models::shapes(&TrainConfig::article()).unwrap(), crate::util::platform())));
        prop_assert!(result.is_ok(), "the golden reader panicked on {:?}", d);
        if let Ok(Err(e)) = result {
            prop_assert_eq!(e.exit().code(), 2, "{}", e);
        }
    }
}
