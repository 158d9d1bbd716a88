// The migration bundles (sql/, and mysql/ with the mysql feature) are embedded with
// refinery's embed_migrations!, which reads them at compile time: a changed or added
// migration must rebuild the crate.
fn main() {
    println!("cargo:rerun-if-changed=sql");
    println!("cargo:rerun-if-changed=mysql");
}
