//! The copy kernel's CUBINs compiled at build time (`build_support/embed_cubins.rs`, a CUDA 12.x
//! NVRTC), and the choice of one for a device: a CUBIN for compute capability X.y runs on X.z
//! with z ≥ y, so a device takes the embedded CUBIN of its own major version with the highest
//! minor version not above its own. A device no embedded CUBIN fits (or a build that embedded
//! none) falls back to NVRTC at run time.

include!(concat!(env!("OUT_DIR"), "/embedded_cubins.rs"));

/// The CUBIN in `cubins` that runs on compute capability `arch` (e.g. 87 for sm_87), with the
/// architecture it was compiled for.
pub fn pick<'a>(cubins: &[(u32, &'a [u8])], arch: u32) -> Option<(u32, &'a [u8])> {
    cubins
        .iter()
        .filter(|(built, _)| built / 10 == arch / 10 && built % 10 <= arch % 10)
        .max_by_key(|(built, _)| *built)
        .copied()
}

/// The embedded CUBIN for compute capability `arch`, if one runs there.
pub fn embedded_cubin(arch: u32) -> Option<(u32, &'static [u8])> {
    pick(EMBEDDED_CUBINS, arch)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIPPED: [u32; 6] = [80, 86, 89, 90, 100, 120];

    #[test]
    fn a_device_takes_its_major_versions_closest_cubin_at_or_below_it() {
        let list: Vec<(u32, &[u8])> = SHIPPED.iter().map(|&a| (a, &b""[..])).collect();
        let chosen = |arch| pick(&list, arch).map(|(a, _)| a);
        assert_eq!(chosen(80), Some(80));
        assert_eq!(chosen(86), Some(86));
        assert_eq!(chosen(87), Some(86), "Orin runs the sm_86 CUBIN");
        assert_eq!(chosen(89), Some(89));
        assert_eq!(chosen(90), Some(90));
        assert_eq!(chosen(103), Some(100), "B300 runs the sm_100 CUBIN");
        assert_eq!(chosen(121), Some(120));
        // Another major version, or older than every CUBIN of its own: NVRTC at run time.
        assert_eq!(chosen(75), None);
        assert_eq!(chosen(110), None);
        assert_eq!(pick(&list[..0], 90), None);
    }

    /// With NVRTC required (the test command), the build must have embedded every shipped
    /// architecture; each is a CUDA ELF image holding the kernel's entry point.
    #[test]
    fn the_shipped_architectures_are_embedded_as_cuda_elf_images() {
        if EMBEDDED_CUBINS.is_empty() {
            assert!(
                std::env::var_os("KVBLOCK_REQUIRE_NVRTC").is_none(),
                "KVBLOCK_REQUIRE_NVRTC is set but the build embedded no CUBIN ({EMBEDDED_CUBINS_NOTE})"
            );
            eprintln!("skipped: this build embedded no CUBIN ({EMBEDDED_CUBINS_NOTE})");
            return;
        }
        let archs: Vec<u32> = EMBEDDED_CUBINS.iter().map(|(a, _)| *a).collect();
        assert_eq!(archs, SHIPPED);
        for (arch, cubin) in EMBEDDED_CUBINS {
            assert_eq!(&cubin[..4], b"\x7fELF", "sm_{arch}");
            // e_machine (little endian, offset 18): EM_CUDA.
            assert_eq!(u16::from_le_bytes([cubin[18], cubin[19]]), 190, "sm_{arch}");
            let name = b"kvb_copy_blocks";
            assert!(
                cubin.windows(name.len()).any(|w| w == name),
                "sm_{arch} holds the kernel's symbol"
            );
        }
        assert!(
            EMBEDDED_CUBINS_NOTE.starts_with("NVRTC 12."),
            "{EMBEDDED_CUBINS_NOTE}"
        );
    }
}
