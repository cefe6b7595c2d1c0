// The module's parts, one init function per binding file, called in this order by module.cpp
// (enums first: the errors and configurations refer to them).
#pragma once

#include "common.hpp"

namespace kvb_py {

void init_enums(nb::module_& m);
void init_errors(nb::module_& m);
void init_pool_model(nb::module_& m);
void init_config(nb::module_& m);
void init_request(nb::module_& m);
void init_results(nb::module_& m);
void init_events(nb::module_& m);
void init_manager(nb::module_& m);
void init_publisher(nb::module_& m);

}  // namespace kvb_py
