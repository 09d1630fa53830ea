//! Load-time refusals of the policy host: every module that cannot be a
//! policy is refused before it can decide, with an error that says why.
#![cfg(feature = "wasm")]

use std::error::Error as _;

use rewind_engine::policy::wasm::{plugins, HostError, LoadError, PolicyHost, PolicyHostConfig};
use rewind_policy_sdk::ABI_VERSION;

fn host() -> PolicyHost {
    PolicyHost::with_default_policy().expect("the default policy loads")
}

/// A hand-assembled module: the three `() -> i32` exports returning
/// constants, one page of memory, and only the exports named in `exports`.
fn tiny_module(abi: i32, facts_ptr: i32, exports: &[&str]) -> Vec<u8> {
    let constant = |value: i32| {
        let mut body = vec![0x41];
        sleb(&mut body, value.into());
        body
    };
    module_of(&[constant(abi), constant(facts_ptr), constant(6)], exports)
}

fn sleb(out: &mut Vec<u8>, mut v: i64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        let done = (v == 0 && byte & 0x40 == 0) || (v == -1 && byte & 0x40 != 0);
        out.push(if done { byte } else { byte | 0x80 });
        if done {
            return;
        }
    }
}

/// [`tiny_module`] with the instructions of `rewind_abi_version`,
/// `rewind_facts_ptr` and `rewind_decide` (without the final `end`) given.
fn module_of(bodies: &[Vec<u8>; 3], exports: &[&str]) -> Vec<u8> {
    fn section(out: &mut Vec<u8>, id: u8, body: &[u8]) {
        out.push(id);
        uleb(out, body.len() as u64);
        out.extend_from_slice(body);
    }
    fn uleb(out: &mut Vec<u8>, mut v: u64) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let funcs = [
        ("rewind_abi_version", &bodies[0]),
        ("rewind_facts_ptr", &bodies[1]),
        ("rewind_decide", &bodies[2]),
    ];
    let mut out = b"\0asm\x01\0\0\0".to_vec();
    section(&mut out, 1, &[1, 0x60, 0, 1, 0x7f]);
    section(&mut out, 3, &[3, 0, 0, 0]);
    section(&mut out, 5, &[1, 0, 1]);
    let mut body = Vec::new();
    let listed: Vec<(&str, u8, u8)> = std::iter::once(("memory", 2u8, 0u8))
        .chain(
            funcs
                .iter()
                .enumerate()
                .map(|(i, (name, _))| (*name, 0u8, i as u8)),
        )
        .filter(|(name, _, _)| exports.contains(name))
        .collect();
    uleb(&mut body, listed.len() as u64);
    for (name, kind, index) in listed {
        uleb(&mut body, name.len() as u64);
        body.extend_from_slice(name.as_bytes());
        body.extend_from_slice(&[kind, index]);
    }
    section(&mut out, 7, &body);
    let mut code = vec![3];
    for (_, body) in funcs {
        // No locals, the instructions, `end`.
        let mut f = vec![0];
        f.extend_from_slice(body);
        f.push(0x0b);
        uleb(&mut code, f.len() as u64);
        code.extend_from_slice(&f);
    }
    section(&mut out, 10, &code);
    out
}

const ALL_EXPORTS: &[&str] = &[
    "memory",
    "rewind_abi_version",
    "rewind_facts_ptr",
    "rewind_decide",
];

#[test]
fn the_hand_assembled_module_is_a_valid_policy() {
    let host = host();
    let module = host
        .load("tiny", &tiny_module(ABI_VERSION as i32, 1024, ALL_EXPORTS))
        .unwrap();
    assert!(host.validate(&module).passed());
}

#[test]
fn wrong_abi_version_is_refused() {
    let err = host()
        .load("wrong-abi", plugins::fixtures::WRONG_ABI)
        .unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::AbiVersion {
                found: 999,
                expected: ABI_VERSION
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("999"), "{err}");
}

#[test]
fn plugins_built_for_earlier_abi_versions_are_refused_naming_both_versions() {
    // Version 2 added the `Restored` session fact, version 3 `Remote` and
    // `OwnerLost`; an older plugin would answer them as unknown facts (404
    // for a live session).
    for old in [1, 2] {
        let err = host()
            .load("old", &tiny_module(old, 1024, ALL_EXPORTS))
            .unwrap_err();
        assert!(
            matches!(
                err,
                LoadError::AbiVersion { found, expected: 3 } if found == old
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains(&format!("version {old}"))
                && err.to_string().contains("version 3"),
            "{err}"
        );
    }
}

#[test]
fn a_module_with_imports_is_refused() {
    let err = host()
        .load("imports", plugins::fixtures::IMPORTS)
        .unwrap_err();
    match &err {
        LoadError::Import { module, name } => {
            assert_eq!((&**module, &**name), ("env", "rewind_host_log"))
        }
        other => panic!("expected an import error, got {other}"),
    }
    assert!(err.to_string().contains("env::rewind_host_log"), "{err}");
}

#[test]
fn missing_exports_are_refused() {
    let host = host();
    for missing in ALL_EXPORTS {
        let exports: Vec<&str> = ALL_EXPORTS
            .iter()
            .copied()
            .filter(|e| e != missing)
            .collect();
        let err = host
            .load("partial", &tiny_module(ABI_VERSION as i32, 1024, &exports))
            .unwrap_err();
        assert!(
            matches!(err, LoadError::MissingExport { name, .. } if name == *missing),
            "without {missing}: {err}"
        );
    }
    let err = host.load("empty-module", b"\0asm\x01\0\0\0").unwrap_err();
    assert!(
        matches!(err, LoadError::MissingExport { name: "memory", .. }),
        "{err}"
    );
}

#[test]
fn bytes_that_are_not_wasm_are_refused() {
    let err = host().load("text", b"(module)").unwrap_err();
    assert!(matches!(err, LoadError::Compile(_)), "{err}");
    let err = host()
        .load("truncated", &plugins::DEFAULT[..plugins::DEFAULT.len() / 2])
        .unwrap_err();
    assert!(matches!(err, LoadError::Compile(_)), "{err}");
}

#[test]
fn a_compile_error_keeps_wasmtimes_error_as_its_source() {
    let err = host().load("text", b"(module)").unwrap_err();
    let source = err.source().expect("the compile error has a source");
    // The message stays complete for callers that print only `Display`.
    assert!(
        err.to_string()
            .starts_with("not a valid WebAssembly module: "),
        "{err}"
    );
    assert!(err.to_string().contains(&source.to_string()), "{err}");
}

#[test]
fn a_probe_that_traps_is_refused_with_the_trap_in_its_source_chain() {
    const UNREACHABLE: u8 = 0x00;
    let module = module_of(
        &[vec![UNREACHABLE], vec![0x41, 0], vec![0x41, 6]],
        ALL_EXPORTS,
    );
    let err = host().load("trapping-probe", &module).unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::Probe {
                export: "rewind_abi_version",
                ..
            }
        ),
        "{err}"
    );
    let trap = std::iter::successors(err.source(), |e| (*e).source())
        .find_map(|e| e.downcast_ref::<wasmtime::Trap>());
    assert_eq!(
        trap,
        Some(&wasmtime::Trap::UnreachableCodeReached),
        "{err:?}"
    );
    assert!(err.to_string().contains("unreachable"), "{err}");
}

#[test]
fn a_facts_pointer_out_of_bounds_or_misaligned_is_refused() {
    let host = host();
    let err = host
        .load(
            "oob",
            &tiny_module(ABI_VERSION as i32, 65536 - 8, ALL_EXPORTS),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::FactsPointer {
                problem: "out of bounds",
                ..
            }
        ),
        "{err}"
    );
    let err = host
        .load(
            "negative",
            &tiny_module(ABI_VERSION as i32, -8, ALL_EXPORTS),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::FactsPointer {
                problem: "out of bounds",
                ..
            }
        ),
        "{err}"
    );
    let err = host
        .load(
            "misaligned",
            &tiny_module(ABI_VERSION as i32, 1028, ALL_EXPORTS),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            LoadError::FactsPointer {
                problem: "misaligned",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn initial_memory_over_the_cap_is_refused() {
    let config = PolicyHostConfig::default().memory_limit_bytes(64 * 1024);
    match PolicyHost::new(config) {
        Err(HostError::Load(LoadError::MemoryTooLarge {
            initial_bytes,
            limit_bytes,
        })) => {
            assert_eq!(limit_bytes, 64 * 1024);
            assert!(initial_bytes > 64 * 1024);
        }
        other => panic!("expected MemoryTooLarge, got {other:?}"),
    }
}

#[test]
fn load_file_maps_the_file_and_names_the_policy_after_it() {
    let dir = std::env::temp_dir().join(format!("rewind-policy-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("strict.wasm");
    std::fs::write(&path, plugins::STRICT).unwrap();
    let host = host();
    let module = host.load_file(&path).unwrap();
    assert_eq!(module.name(), "strict");
    assert!(host.validate(&module).passed());
    let err = host.load_file(dir.join("absent.wasm")).unwrap_err();
    assert!(matches!(err, LoadError::Io { .. }), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_module_from_another_host_cannot_be_swapped_in() {
    let (a, b) = (host(), host());
    let module = a.load("strict", plugins::STRICT).unwrap();
    assert!(b.swap(&module).is_err());
    assert_eq!(b.live_generation(), 1);
}

#[test]
fn a_compilation_cache_directory_can_be_configured() {
    let dir = std::env::temp_dir().join(format!("rewind-policy-cache-{}", std::process::id()));
    let config = PolicyHostConfig::default().compilation_cache_dir(Some(dir.clone()));
    let first = PolicyHost::new(config.clone()).unwrap();
    drop(first);
    let second = PolicyHost::new(config).unwrap();
    assert_eq!(second.live_name(), "default");
    let _ = std::fs::remove_dir_all(&dir);
}
