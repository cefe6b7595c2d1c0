// kvblock/error.hpp: kvb::Error and the status check every wrapper call makes.
// Part of the C++ wrapper; include kvblock.hpp, which includes every part.
#ifndef KVBLOCK_ERROR_HPP
#define KVBLOCK_ERROR_HPP

#include <stdexcept>
#include <string>

#include "../kvblock.h"

namespace kvb {

/// A failed kvblock call: the status and the message of kvb_last_error_message().
class Error : public std::runtime_error {
  public:
    Error(kvb_status_t status, const std::string& message)
        : std::runtime_error(std::string(kvb_status_string(status)) + ": " + message),
          status_(status) {}
    kvb_status_t status() const noexcept { return status_; }

  private:
    kvb_status_t status_;
};

/// Throws kvb::Error unless `status` is KVB_OK.
inline void check(kvb_status_t status) {
    if (status != KVB_OK) { throw Error(status, kvb_last_error_message()); }
}

}  // namespace kvb

#endif  // KVBLOCK_ERROR_HPP
