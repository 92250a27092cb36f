//! Prints the cycles of every crate of the workspace, or of the crate roots given as arguments.
//! `cargo run -p layering --example cycles [-- crates/node-agent/src/lib.rs]`

use std::path::{Path, PathBuf};

fn main() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let args: Vec<PathBuf> = std::env::args().skip(1).map(PathBuf::from).collect();
    let roots = if args.is_empty() {
        layering::workspace_roots(&workspace)
    } else {
        args
    };
    let mut found = 0;
    for root in roots {
        match layering::check_crate(&root) {
            Ok(cycles) => {
                for c in cycles {
                    found += 1;
                    print!("{}: {c}", root.display());
                }
            }
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(2);
            }
        }
    }
    println!("{found} cycles");
    if found > 0 {
        std::process::exit(1);
    }
}
