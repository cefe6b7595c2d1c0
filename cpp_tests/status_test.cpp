// Smoke test of the C ABI's status helpers: the library loads and the header matches it.
#include <gtest/gtest.h>

#include <string>

#include "kvblock.h"

TEST(Status, NamesAreStable) {
    EXPECT_EQ(std::string(kvb_status_string(KVB_OK)), "ok");
    EXPECT_EQ(std::string(kvb_status_string(KVB_STATUS_OUT_OF_BLOCKS)), "out of blocks");
}

TEST(Status, LastErrorMessageIsNeverNull) {
    EXPECT_NE(kvb_last_error_message(), nullptr);
}
