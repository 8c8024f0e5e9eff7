//! Tools from PyPI that the protocol tests run, written by others against
//! the same specifications: the Standard Webhooks reference library, which
//! signs deposits, and schemathesis, which holds the gateway simulator to
//! its OpenAPI document. They are installed, pinned, into a virtual
//! environment of the tests' own under `.tmp/`, as `scripts/fuzz` installs
//! its schemathesis; test binaries running at once take turns (`flock`).

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

/// The specification's own Python library.
pub const STANDARDWEBHOOKS: &str = "standardwebhooks==1.1.0";
/// The same version `scripts/fuzz` runs.
pub const SCHEMATHESIS: &str = "schemathesis==4.32.5";

/// Within one test binary, one installation at a time.
static INSTALLING: Mutex<()> = Mutex::new(());

/// The environment's directory, with every pinned package installed.
pub fn protocol_venv() -> PathBuf {
    let _one_at_a_time = INSTALLING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let tmp = repo.join(".tmp");
    std::fs::create_dir_all(&tmp).expect("creating .tmp/");
    let venv = tmp.join("protocol-venv");
    let wanted = format!("{STANDARDWEBHOOKS} {SCHEMATHESIS}");
    // The marker names what was installed; a changed pin installs again.
    let script = r#"
        set -e
        if [ "$(cat "$VENV/installed" 2>/dev/null)" = "$WANTED" ]; then exit 0; fi
        if ! python3 -m venv "$VENV"; then
            echo "python3's venv module is missing: apt-get install python3-venv (./scripts/test installs it)" >&2
            exit 1
        fi
        "$VENV/bin/pip" install --quiet --disable-pip-version-check $WANTED
        printf '%s' "$WANTED" > "$VENV/installed"
    "#;
    let status = Command::new("flock")
        .arg(tmp.join("protocol-venv.lock"))
        .args(["sh", "-c", script])
        .env("VENV", &venv)
        .env("WANTED", &wanted)
        .status()
        .expect("flock runs (util-linux); python3 must be installed: apt-get install python3 python3-venv");
    assert!(
        status.success(),
        "installing {wanted} into {} failed (see above)",
        venv.display()
    );
    venv
}

/// A program of the environment, e.g. `python` or `st`.
pub fn venv_program(name: &str) -> PathBuf {
    protocol_venv().join("bin").join(name)
}
