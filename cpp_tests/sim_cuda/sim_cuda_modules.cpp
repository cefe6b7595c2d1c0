// Entry points for modules: cuModuleLoadData accepts only a CUBIN for an architecture the simulated
// device runs, and cuModuleGetFunction finds names in its symbol table (sim_cuda_launch.cpp runs
// the one kernel the simulator knows).
#include <cstdio>
#include <cstring>

#include "sim_cuda_internal.hpp"

using namespace kvb_sim;

namespace {

// ---- ELF (CUBIN) parsing ------------------------------------------------------------------------------
template <typename T>
T rd(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

CUresult parseCubin(const uint8_t* img, std::set<std::string>& symbols, std::string& why) {
    if (!img) return kInvalidValue;
    if (std::memcmp(img,
                    "\x7f"
                    "ELF",
                    4) != 0) {
        why = "not an ELF image (a CUBIN is one; PTX and fatbins are not simulated)";
        return kInvalidImage;
    }
    if (img[4] != 2 || img[5] != 1) {
        why = "not a 64-bit little-endian ELF";
        return kInvalidImage;
    }
    uint16_t machine = rd<uint16_t>(img + 18);
    if (machine != 190) {
        why = "ELF for machine " + std::to_string(machine) + ", not EM_CUDA (190)";
        return kInvalidImage;
    }
    uint32_t flags = rd<uint32_t>(img + 48);
    int arch = img[8] >= 8 ? static_cast<int>((flags >> 8) & 0xff) : static_cast<int>(flags & 0xff);
    int dev = config().arch;
    if (arch / 10 != dev / 10 || arch % 10 > dev % 10) {
        why =
            "a CUBIN for sm_" + std::to_string(arch) + " does not run on sm_" + std::to_string(dev);
        return kNoBinaryForGpu;
    }
    uint64_t shoff = rd<uint64_t>(img + 40);
    uint16_t shentsize = rd<uint16_t>(img + 58), shnum = rd<uint16_t>(img + 60);
    if (shoff == 0 || shentsize != 64 || shnum == 0 || shnum > 4096 || shoff > (64u << 20)) {
        why = "no usable section headers";
        return kInvalidImage;
    }
    for (unsigned i = 0; i < shnum; ++i) {
        const uint8_t* sh = img + shoff + uint64_t(i) * 64;
        if (rd<uint32_t>(sh + 4) != 2 /* SHT_SYMTAB */) continue;
        uint64_t off = rd<uint64_t>(sh + 24), size = rd<uint64_t>(sh + 32);
        uint32_t link = rd<uint32_t>(sh + 40);
        if (link >= shnum || size > (64u << 20)) break;
        const uint8_t* strsh = img + shoff + uint64_t(link) * 64;
        const char* strtab = reinterpret_cast<const char*>(img + rd<uint64_t>(strsh + 24));
        uint64_t strsize = rd<uint64_t>(strsh + 32);
        for (uint64_t k = 0; k + 24 <= size; k += 24) {
            uint32_t name = rd<uint32_t>(img + off + k);
            if (name > 0 && name < strsize)
                symbols.insert(std::string(strtab + name, strnlen(strtab + name, strsize - name)));
        }
    }
    if (symbols.empty()) {
        why = "the ELF has no symbol table";
        return kInvalidImage;
    }
    return kSuccess;
}

}  // namespace

// ---- Modules ------------------------------------------------------------------------------------------
KVB_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
    ENTER("cuModuleLoadData");
    NEED_CONTEXT();
    if (!module || !image) return kInvalidValue;
    auto m = std::make_unique<Module>();
    std::string why;
    CUresult rc = parseCubin(static_cast<const uint8_t*>(image), m->symbols, why);
    if (rc != kSuccess) {
        std::fprintf(stderr, "sim-cuda: cuModuleLoadData refuses the image: %s\n", why.c_str());
        return rc;
    }
    m->id = s.nextModule++;
    Module* p = m.get();
    s.modules[p] = std::move(m);
    *module = p;
    return kSuccess;
}

KVB_EXPORT CUresult cuModuleUnload(CUmodule module) {
    ENTER("cuModuleUnload");
    NEED_CONTEXT();
    if (s.modules.erase(static_cast<Module*>(module)) == 0) return kInvalidHandle;
    return kSuccess;
}

KVB_EXPORT CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule module, const char* name) {
    ENTER("cuModuleGetFunction");
    NEED_CONTEXT();
    if (!hfunc || !name) return kInvalidValue;
    auto it = s.modules.find(static_cast<Module*>(module));
    if (it == s.modules.end()) return kInvalidHandle;
    Module& m = *it->second;
    if (!m.symbols.count(name)) return kNotFound;
    if (std::string(name) != "kvb_copy_blocks") {
        std::fprintf(stderr, "sim-cuda: kernel %s is not simulated (only kvb_copy_blocks)\n", name);
        return kNotFound;
    }
    m.functions.push_back({&m, name});
    *hfunc = &m.functions.back();
    return kSuccess;
}
