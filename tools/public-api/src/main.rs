//! Prints the public API of a crate, one item a line (public-api sorts them), from the
//! rustdoc JSON file named by the first argument.
//!
//! `.ci/public-api.sh` builds the JSON and compares this output with the
//! checked-in `public-api.txt`.

use std::{env, process::ExitCode};

fn main() -> ExitCode {
    let Some(path) = env::args_os().nth(1) else {
        eprintln!("usage: tower-pinned-window-public-api <rustdoc JSON file>");
        return ExitCode::from(2);
    };
    // Blanket impls (`From<T> for T`, `Any`, `Borrow`...) are the same for
    // every type and would bury the crate's own items; auto traits (`Send`,
    // `Sync`, `Unpin`) and derives stay: losing one breaks users.
    let api = match public_api::Builder::from_rustdoc_json(&path)
        .omit_blanket_impls(true)
        .build()
    {
        Ok(api) => api,
        Err(err) => {
            eprintln!(
                "public-api could not read {}: {err}\n(is the rustdoc JSON format newer than the \
                 public-api version pinned in tools/public-api/Cargo.toml reads?)",
                path.to_string_lossy()
            );
            return ExitCode::FAILURE;
        }
    };
    for item in api.items() {
        println!("{item}");
    }
    ExitCode::SUCCESS
}
