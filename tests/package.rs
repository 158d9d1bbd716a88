//! What the published package holds and needs: only what a user of the crate needs, the
//! licence texts its licence names, one rand in the library's tree, and the library's
//! tokio features (the command line's runtime and Ctrl-C handling belong to feature cli).

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

fn cargo(args: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(cargo)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

#[test]
fn the_package_holds_only_what_a_user_needs() {
    let list = cargo(&["package", "--list", "--allow-dirty", "--offline"]);
    let top: BTreeSet<&str> = list
        .lines()
        .map(|path| path.split('/').next().unwrap_or(path))
        .collect();
    let allowed = [
        ".cargo_vcs_info.json",
        "ARCHITECTURE.md",
        "Cargo.lock",
        "Cargo.toml",
        "Cargo.toml.orig",
        "LICENSE-APACHE",
        "LICENSE-MIT",
        "MOTIVATION.md",
        "POWEROFF.md",
        "README.md",
        "build.rs",
        "docs",
        "mysql",
        "postgres",
        "sql",
        "src",
    ];
    let extra: Vec<&&str> = top
        .iter()
        .filter(|entry| !allowed.contains(entry))
        .collect();
    assert!(extra.is_empty(), "not for users: {extra:?}\n{list}");
    for needed in [
        "README.md",
        "docs",
        "LICENSE-MIT",
        "LICENSE-APACHE",
        "build.rs",
        "src",
        "sql",
        "mysql",
        "postgres",
    ] {
        assert!(
            top.contains(needed),
            "{needed} missing from the package:\n{list}"
        );
    }
    assert!(list.lines().any(|path| path == "sql/V1__create_schema.sql"));
}

#[test]
fn the_licence_texts_of_the_declared_licence_exist() {
    assert_eq!(env!("CARGO_PKG_LICENSE"), "MIT OR Apache-2.0");
    let mit = include_str!("../LICENSE-MIT");
    assert!(mit.contains("Permission is hereby granted, free of charge"));
    let apache = include_str!("../LICENSE-APACHE");
    assert!(apache.contains("Apache License") && apache.contains("Version 2.0, January 2004"));
    assert!(apache.contains("END OF TERMS AND CONDITIONS"));
}

#[test]
fn the_library_tree_has_one_rand() {
    let tree = normal_tree(&["--all-features"]);
    let rands: BTreeSet<&str> = tree
        .lines()
        .filter(|line| line.starts_with("rand v"))
        .map(|line| line.split_whitespace().take(2).last().unwrap_or(line))
        .collect();
    assert_eq!(
        rands.len(),
        1,
        "rand versions in the library's tree: {rands:?}"
    );
}

#[test]
fn the_library_asks_tokio_only_for_what_it_uses() {
    let metadata: Value = serde_json::from_str(&cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--locked",
        "--offline",
        "--no-deps",
    ]))
    .expect("JSON");
    let ours = &metadata["packages"][0];
    let tokio = ours["dependencies"]
        .as_array()
        .expect("dependencies")
        .iter()
        .find(|d| d["name"] == "tokio" && d["kind"].is_null())
        .expect("tokio is a dependency");
    let features: BTreeSet<&str> = tokio["features"]
        .as_array()
        .expect("features")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let used = BTreeSet::from(["macros", "net", "sync", "time"]);
    assert_eq!(features, used, "the library's tokio features");
    let cli: Vec<&str> = ours["features"]["cli"]
        .as_array()
        .expect("feature cli")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for needed in ["tokio/rt", "tokio/signal"] {
        assert!(cli.contains(&needed), "feature cli lacks {needed}: {cli:?}");
    }
}

/// The names and versions of the packages the build with `features` compiles (normal
/// dependencies, this platform).
fn normal_tree(features: &[&str]) -> String {
    let mut args = vec![
        "tree",
        "--offline",
        "--locked",
        "-e",
        "normal",
        "--prefix",
        "none",
        "--format",
        "{p}",
    ];
    args.extend_from_slice(features);
    cargo(&args)
}

/// librdkafka is a C library built from source (minutes, and a C toolchain): only the
/// `kafka` feature may pull it in, never the default build (issue 13's acceptance).
#[test]
fn the_default_build_does_not_compile_librdkafka() {
    let has_librdkafka = |tree: &str| tree.lines().any(|line| line.starts_with("rdkafka-sys v"));
    assert!(
        !has_librdkafka(&normal_tree(&[])),
        "the default build's tree holds rdkafka-sys"
    );
    assert!(
        !has_librdkafka(&normal_tree(&["--features", "cli,mysql"])),
        "the cli and mysql features pull in rdkafka-sys"
    );
    assert!(
        has_librdkafka(&normal_tree(&["--features", "kafka"])),
        "the kafka feature no longer builds librdkafka: is this test still checking anything?"
    );
}

/// The PostgreSQL driver comes with the `postgres` feature only (issue 21).
#[test]
fn the_default_build_does_not_pull_in_tokio_postgres() {
    let has_driver = |tree: &str| {
        tree.lines()
            .any(|line| line.starts_with("tokio-postgres v"))
    };
    assert!(
        !has_driver(&normal_tree(&[])),
        "the default build's tree holds tokio-postgres"
    );
    assert!(
        has_driver(&normal_tree(&["--features", "postgres"])),
        "the postgres feature no longer pulls in tokio-postgres: is this test still checking anything?"
    );
}
