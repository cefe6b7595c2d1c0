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
void init_disk(nb::module_& m);
// The remote tier's enum and result types (before init_config: its helper's default refers to
// the enum), and ManagerConfig.with_remote_tier (called by init_config).
void init_remote(nb::module_& m);
void init_config_remote(nb::class_<kvb::Config>& config);
// Disaggregated prefill/decode: TransferOutcome, TransferStats, RowRuns, LoopbackHub.
void init_disagg(nb::module_& m);

}  // namespace kvb_py
