// `sqlx::migrate!` embeds the migrations at compile time; a new file in the
// folder must rebuild the crate, or the binary would miss a migration.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
