//! The declared minimum Rust (`rust-version` in Cargo.toml) is true for the locked
//! dependency graph: no package of `cargo metadata` (locked, offline) declares a higher
//! one. Only one toolchain can be installed where the tests run, so this is how a
//! dependency update that raises the real minimum is caught. README.md states the same
//! version.
//!
//! The metadata is filtered to the host platform and to the features this test was built
//! with: that is exactly the graph `cargo test` itself just downloaded, so the check works
//! offline on a fresh machine (an empty cargo home). Unfiltered, `cargo metadata` wants
//! the source of every platform's packages in the lock file (`android_system_properties`,
//! `windows-*`), which only an earlier `cargo fetch` would have left in the cache.

use std::process::Command;

use serde_json::Value;

/// `"1.92"`, `"1.88.0"` as comparable numbers (missing parts are 0).
fn version(text: &str) -> [u64; 3] {
    let mut parts = [0; 3];
    for (part, number) in parts.iter_mut().zip(text.split('.')) {
        *part = number
            .parse()
            .unwrap_or_else(|_| panic!("rust-version {text:?} is not a version"));
    }
    parts
}

/// The platform this test runs on, as rustc names it (`x86_64-unknown-linux-gnu`).
fn host_triple() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let output = Command::new(rustc).arg("-vV").output().expect("rustc runs");
    let text = String::from_utf8(output.stdout).expect("UTF-8");
    text.lines()
        .find_map(|line| line.strip_prefix("host: "))
        .unwrap_or_else(|| panic!("rustc -vV names no host:\n{text}"))
        .to_owned()
}

/// The package's optional features this test binary was compiled with: the metadata must
/// not ask for the sources of a feature's dependencies that `cargo test` did not build.
fn enabled_features() -> String {
    [
        ("cli", cfg!(feature = "cli")),
        ("mysql", cfg!(feature = "mysql")),
        ("kafka", cfg!(feature = "kafka")),
        ("postgres", cfg!(feature = "postgres")),
    ]
    .iter()
    .filter(|(_, on)| *on)
    .map(|(name, _)| *name)
    .collect::<Vec<_>>()
    .join(",")
}

fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let host = host_triple();
    let features = enabled_features();
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .args(["--filter-platform", &host, "--features", &features])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo metadata (locked, offline, for {host}, features [{features}]) failed; it reads \
         only the packages `cargo test` built, so a missing one means the lock file changed \
         under the build: run the tests again: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON")
}

#[test]
fn no_locked_dependency_needs_a_newer_rust_than_we_declare() {
    let metadata = metadata();
    let packages = metadata["packages"].as_array().expect("packages");
    let ours = packages
        .iter()
        .find(|p| p["name"] == env!("CARGO_PKG_NAME") && p["source"].is_null())
        .expect("this package");
    let known: Vec<&str> = ["cli", "mysql", "kafka", "postgres"].to_vec();
    let unknown: Vec<&String> = ours["features"]
        .as_object()
        .expect("features")
        .keys()
        .filter(|name| !known.contains(&name.as_str()) && *name != "default")
        .collect();
    assert!(
        unknown.is_empty(),
        "features {unknown:?} are new: add them to enabled_features() so their dependencies \
         are checked too"
    );
    let declared = ours["rust_version"]
        .as_str()
        .expect("Cargo.toml declares rust-version");
    let mut newer: Vec<String> = packages
        .iter()
        .filter(|p| !p["source"].is_null())
        .filter_map(|p| {
            let needs = p["rust_version"].as_str()?;
            (version(needs) > version(declared))
                .then(|| format!("{} {} needs Rust {needs}", p["name"], p["version"]))
        })
        .collect();
    newer.sort();
    assert!(
        newer.is_empty(),
        "Cargo.toml says rust-version = {declared:?}, but {}: raise rust-version (and \
         README.md's toolchain line) to the highest of these, or pin older versions",
        newer.join(", ")
    );
    assert!(packages.len() > 50, "the whole locked graph was read");
}

#[test]
fn readme_states_the_declared_minimum() {
    let declared = env!("CARGO_PKG_RUST_VERSION");
    let readme = include_str!("../README.md");
    assert!(
        readme.contains(&format!("Rust {declared} or later")),
        "README.md must say \"Rust {declared} or later\" (Cargo.toml's rust-version)"
    );
}
