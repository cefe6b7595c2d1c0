/* C consumer of an installed kvblock, compiled with `pkg-config --cflags --libs kvblock`. */
#include <kvblock.h>

#include <stdio.h>

int main(void) {
    uint32_t major = 0, minor = 0, patch = 0;
    if (kvb_version(&major, &minor, &patch) != KVB_OK) {
        fprintf(stderr, "kvb_version: %s\n", kvb_last_error_message());
        return 1;
    }
    printf("%u.%u.%u\n", major, minor, patch);
    return 0;
}
