// The SQL bundle is embedded with refinery's embed_migrations!, which reads sql/ at compile
// time: a changed or added migration must rebuild the crate.
fn main() {
    println!("cargo:rerun-if-changed=sql");
}
