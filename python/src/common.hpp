// Shared by every binding file: the GIL-releasing call helpers, argument errors and reprs.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <kvblock.hpp>

#include <array>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace kvb_py {

[[noreturn]] inline void invalid_argument(const std::string& message) {
    throw kvb::Error(KVB_STATUS_INVALID_ARGUMENT, message);
}

/// Runs `f` (calls into the library) with the GIL released.
template <typename F>
auto nogil(F&& f) {
    nb::gil_scoped_release release;
    return f();
}

/// Calls a C function returning a status with the GIL released; raises on failure.
template <typename F>
void call(F&& f) {
    nogil([&] { kvb::check(f()); });
}

/// `repr` of an object as `Name(field=value, ...)`, reading the fields as Python attributes.
inline void add_repr(nb::handle cls, const char* name, std::initializer_list<const char*> fields) {
    std::vector<const char*> names(fields);
    nb::setattr(cls, "__repr__",
                nb::cpp_function(
                    [name, names](nb::handle self) {
                        std::string out = std::string(name) + "(";
                        for (size_t i = 0; i < names.size(); ++i) {
                            if (i) out += ", ";
                            out += names[i];
                            out += "=";
                            out += nb::repr(self.attr(names[i])).c_str();
                        }
                        return out + ")";
                    },
                    nb::is_method()));
}

/// A new numpy int32 array of `shape` owning its memory.
inline nb::ndarray<nb::numpy, int32_t> new_int32_array(std::initializer_list<size_t> shape) {
    size_t n = 1;
    for (size_t d : shape) n *= d;
    auto* data = new int32_t[n == 0 ? 1 : n];
    nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<int32_t*>(p); });
    return nb::ndarray<nb::numpy, int32_t>(data, shape.size(), shape.begin(), owner);
}

}  // namespace kvb_py
