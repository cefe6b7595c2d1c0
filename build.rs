//! Embeds the copy kernel's CUBINs (`build_support/embed_cubins.rs`), and gives the shared
//! library a versioned SONAME on ELF platforms: `libkvblock.so.<major>`, the ABI
//! major version of `kvb_version`. rustc sets none by default; with one, programs linked against
//! `libkvblock.so` record `libkvblock.so.<major>` and keep running across minor upgrades.

#[path = "build_support/embed_cubins.rs"]
mod embed_cubins;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    embed_cubins::embed();
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if matches!(
        os.as_str(),
        "linux" | "android" | "freebsd" | "netbsd" | "openbsd" | "dragonfly" | "solaris"
    ) {
        let major = env!("CARGO_PKG_VERSION_MAJOR");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libkvblock.so.{major}");
    }
}
