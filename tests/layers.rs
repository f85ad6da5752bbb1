//! `scripts/layers` fails on an upward use in each form it can take (and from the records' floor,
//! the lowest but the kernel's), on a short name at the crate root (which keeps none: every path
//! names its folder), on a re-export, and on a fuzz targets' root (src/lib.rs) that is built
//! outside fuzz builds or makes a folder public, or a binary's root that declares the fuzz
//! facade; the tree as it is passes.
use std::path::{Path, PathBuf};
use std::process::Command;

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

fn layers(src: &Path) -> (i32, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(root.join("scripts/layers"))
        .env("LAYERS_SRC", src)
        .output()
        .expect("python3 runs scripts/layers");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Each line `planted` at the end of `file` (a path under `scratch`) alone makes scripts/layers
/// exit 1 naming that file and what it `named`; the file is left as it was.
fn each_refused(scratch: &Path, file: &str, plants: &[(&str, &str)]) {
    let path = scratch.join(file);
    let original = std::fs::read_to_string(&path).unwrap();
    for (planted, named) in plants {
        std::fs::write(&path, format!("{original}\n{planted}\n")).unwrap();
        let (code, said) = layers(scratch);
        assert_eq!(code, 1, "{planted:?} passed: {said}");
        assert!(said.contains(&format!("src/{file}")) && said.contains(named), "{planted:?}: {said}");
    }
    std::fs::write(&path, original).unwrap();
}

#[test]
fn layers_refuses_every_form_of_an_upward_use() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scratch: PathBuf = std::env::temp_dir().join(format!("quiesce-layers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    copy_tree(&root.join("src"), &scratch);
    assert_eq!(layers(&scratch), (0, String::new()), "the tree as it is");
    each_refused(
        &scratch,
        "kernel/users.rs",
        &[
            ("use crate::init::run::Config;", "uses init/"),
            ("use crate::{init::run::Config};", "uses init/"),
            ("use crate::{kernel::sys, init::{run::{self, Config}}};", "uses init/"),
            ("fn f() { let _ = crate::init::run::run; }", "uses init/"),
            ("use crate::spawn::plan::Plan;", "uses spawn/"),
            ("use crate::{\n    state,\n    commands::verify,\n};", "uses commands/"),
            ("use crate::sys;", "crate::sys, which is no folder"),
            ("pub use crate::kernel::caps;", "re-exports"),
            ("pub(crate) use super::caps::*;", "re-exports"),
        ],
    );
    // The records sit below every floor that fills them in, stores or signs them.
    each_refused(
        &scratch,
        "record/freeze.rs",
        &[
            ("use crate::state::dir::Status;", "uses state/"),
            ("use crate::observe::sockets::Listening;", "uses observe/"),
        ],
    );
    // The fuzz targets' crate root is empty outside fuzz builds and keeps the folders private.
    let lib = scratch.join("lib.rs");
    let root = std::fs::read_to_string(&lib).unwrap();
    for (text, named) in [
        (format!("{root}\npub mod state_too;\n"), "makes module state_too public"),
        (root.replace("#![cfg(fuzzing)]", ""), "not empty outside fuzz builds"),
    ] {
        std::fs::write(&lib, &text).unwrap();
        let (code, said) = layers(&scratch);
        assert_eq!(code, 1, "{named:?} passed: {said}");
        assert!(said.contains("src/lib.rs") && said.contains(named), "{named:?}: {said}");
    }
    std::fs::write(&lib, root).unwrap();
    let main_rs = scratch.join("main.rs");
    let main_text = std::fs::read_to_string(&main_rs).unwrap();
    std::fs::write(&main_rs, format!("{main_text}\nmod fuzz;\n")).unwrap();
    let (code, said) = layers(&scratch);
    assert!(code == 1 && said.contains("src/main.rs declares the fuzz facade"), "{said}");
    std::fs::remove_dir_all(&scratch).unwrap();
}
