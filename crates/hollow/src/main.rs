//! `hollow`: a fleet of node agents in one process (not built yet).

fn main() {
    eprintln!("hollow: the fleet is not implemented yet");
    std::process::exit(2);
}
