//! The statebench command line; a thin layer over the library.

fn main() {
    println!("statebench {}", env!("CARGO_PKG_VERSION"));
}
