// The shared remote tier through the public header, against a real redis-server the test
// starts on a free loopback port with a password (failing, saying so, when redis-server is
// not installed; scripts/setup.sh installs it): a second manager reuses the prefix the first
// computed with the right bytes, a wrong password fails creation with a clear error, the
// config versions before the remote tier still work, and bad arguments are refused.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "kvblock.hpp"
#include "test_support.hpp"

namespace {

namespace fs = std::filesystem;

constexpr int32_t kWindow = 64;
constexpr int32_t kTokensPerBlock = 4;
constexpr int kHeadSize = 4;
constexpr size_t kRowBytes = 2 * kTokensPerBlock * kHeadSize;  // 1 layer, 1 head, 1 byte
const char* const kPassword = "kvblock-cpp-test-secret";

using kvb_test::tokenRun;

bool redisInstalled() {
    return std::system(
               "command -v redis-server >/dev/null 2>&1 && "
               "command -v redis-cli >/dev/null 2>&1") == 0;
}

// A free loopback port (the kernel picks it).
int freePort() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof(a);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
        ::close(fd);
        return -1;
    }
    ::close(fd);
    return ntohs(a.sin_port);
}

// A redis-server daemon in a temporary directory, shut down by the destructor.
class RedisServer {
  public:
    RedisServer() {
        port_ = freePort();
        dir_ = fs::temp_directory_path() /
               ("kvblock-redis-cpp-" + std::to_string(::getpid()) + "-" + std::to_string(port_));
        fs::create_directories(dir_);
        std::string cmd = "redis-server --bind 127.0.0.1 --port " + std::to_string(port_) +
                          " --requirepass " + kPassword + " --save '' --appendonly no" +
                          " --daemonize yes --dir " + dir_.string() + " --logfile redis.log" +
                          " --pidfile " + (dir_ / "redis.pid").string();
        started_ = std::system(cmd.c_str()) == 0;
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (started_ && cli("PING") != 0) {
            if (std::chrono::steady_clock::now() > deadline) started_ = false;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }
    ~RedisServer() {
        cli("SHUTDOWN NOSAVE");
        fs::remove_all(dir_);
    }
    RedisServer(const RedisServer&) = delete;
    RedisServer& operator=(const RedisServer&) = delete;

    bool started() const { return started_; }
    std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
    int cli(const std::string& args) const {
        std::string cmd = "redis-cli -p " + std::to_string(port_) + " -a " + kPassword +
                          " --no-auth-warning " + args + " 2>/dev/null | grep -qv '^ERR'";
        return std::system(cmd.c_str());
    }

  private:
    int port_ = -1;
    fs::path dir_;
    bool started_ = false;
};

kvb::Config remoteConfig(const std::string& url, const std::string& password = kPassword) {
    kvb::Config c;
    c.addWindow(kWindow, 8, 8, 1, 1, kHeadSize);
    c.raw.tokens_per_block = kTokensPerBlock;
    c.raw.max_sequence_length = kWindow;
    c.raw.bytes_per_element = 1;
    c.raw.copy_backend = KVB_COPY_BACKEND_HOST;
    c.withRemoteTier(url, "cpp-test-model", password);
    return c;
}

uint8_t patternByte(int32_t token, size_t byte) {
    return static_cast<uint8_t>(1u + (static_cast<uint32_t>(token) * 31u + byte * 7u) % 251u);
}

uint8_t* rowOf(const kvb::Manager& m, int32_t block) {
    kvb_block_info_t info = m.getBlockInfo(kWindow, block);
    EXPECT_EQ(info.cache_level, KVB_CACHE_LEVEL_PRIMARY);
    auto [base, rowBytes] = m.getPoolPointer(kWindow, KVB_CACHE_LEVEL_PRIMARY);
    EXPECT_EQ(rowBytes, kRowBytes);
    return base + static_cast<size_t>(info.memory_index) * rowBytes;
}

void writePattern(const kvb::Manager& m, uint64_t id, const std::vector<int32_t>& tokens) {
    std::vector<int32_t> blocks = m.getCacheBlockIds(id, kWindow);
    for (size_t pos = 0; pos < tokens.size(); ++pos) {
        uint8_t* row = rowOf(m, blocks[pos / kTokensPerBlock]);
        size_t t = pos % kTokensPerBlock;
        for (size_t kv = 0; kv < 2; ++kv)
            for (size_t e = 0; e < kHeadSize; ++e) {
                size_t at = kv * kTokensPerBlock * kHeadSize + t * kHeadSize + e;
                row[at] = patternByte(tokens[pos], at);
            }
    }
}

void expectPattern(const kvb::Manager& m, uint64_t id, const std::vector<int32_t>& tokens,
                   int32_t numTokens) {
    std::vector<int32_t> blocks = m.getCacheBlockIds(id, kWindow);
    for (int32_t pos = 0; pos < numTokens; ++pos) {
        uint8_t* row = rowOf(m, blocks[static_cast<size_t>(pos / kTokensPerBlock)]);
        size_t t = static_cast<size_t>(pos % kTokensPerBlock);
        for (size_t kv = 0; kv < 2; ++kv)
            for (size_t e = 0; e < kHeadSize; ++e) {
                size_t at = kv * kTokensPerBlock * kHeadSize + t * kHeadSize + e;
                ASSERT_EQ(row[at], patternByte(tokens[static_cast<size_t>(pos)], at))
                    << "token " << pos;
            }
    }
}

void settle(kvb::Manager& m) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
        m.remotePoll();
        kvb_remote_stats_t s = m.getRemoteStats();
        if (s.writes_queued == 0 && s.lookups_in_flight == 0 && s.fetches_in_flight == 0) return;
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "remote I/O hangs";
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
}

// A real Redis is part of the test environment (scripts/setup.sh installs it): its absence fails.
#define REQUIRE_REDIS(server)                                                                    \
    ASSERT_TRUE(redisInstalled()) << "redis-server / redis-cli not found: run scripts/setup.sh"; \
    RedisServer server;                                                                          \
    ASSERT_TRUE(server.started())

TEST(RemoteTier, SecondManagerReusesThePrefixTheFirstComputed) {
    REQUIRE_REDIS(server);
    std::vector<int32_t> prompt = tokenRun(3000, 17);
    {
        kvb::Manager a(remoteConfig(server.url()));
        EXPECT_TRUE(a.hasRemoteTier());
        a.addSequence(kvb::Request(1, prompt));
        writePattern(a, 1, prompt);
        a.storeContextBlocks(1, static_cast<int32_t>(prompt.size()));
        a.removeSequence(1, true);
        settle(a);
        EXPECT_EQ(a.getRemoteStats().writes, 4u);
    }
    kvb::Manager b(remoteConfig(server.url()));
    kvb::Request req(2, prompt);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
        std::vector<kvb_remote_prefetch_t> p = b.remotePrefetch({req});
        if (p[0].pending == 0) break;
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "remote prefetch hangs";
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(b.remoteBlocksPending(req), 0);
    kvb_remote_stats_t s = b.getRemoteStats();
    EXPECT_EQ(s.hits, 4u);
    EXPECT_EQ(s.verify_failures, 0u);
    kvb_admission_t r = b.addSequence(req);
    EXPECT_EQ(r.prepopulated_prompt_len, 16);
    expectPattern(b, 2, prompt, 16);
}

TEST(RemoteTier, WrongPasswordFailsCreationWithAClearError) {
    REQUIRE_REDIS(server);
    try {
        kvb::Manager m(remoteConfig(server.url(), "not-the-password"));
        FAIL() << "created with a wrong password";
    } catch (const kvb::Error& e) {
        EXPECT_EQ(e.status(), KVB_STATUS_INVALID_CONFIG);
        EXPECT_NE(std::string(e.what()).find("refused the credentials"), std::string::npos)
            << e.what();
    }
}

TEST(RemoteTier, ConfigVersionsAndBadArguments) {
    // The config before `remote`: no remote tier (no server needed).
    kvb::Config c = remoteConfig("redis://127.0.0.1:1");
    kvb_manager_config_t raw = c.raw;
    raw.windows = c.windows.data();
    raw.num_windows = c.windows.size();
    raw.struct_size = static_cast<uint32_t>(offsetof(kvb_manager_config_t, remote));
    kvb_manager_t* m = nullptr;
    ASSERT_EQ(kvb_manager_create(&raw, &m), KVB_OK) << kvb_last_error_message();
    bool has = true;
    ASSERT_EQ(kvb_manager_has_remote_tier(m, &has), KVB_OK);
    EXPECT_FALSE(has);
    kvb_remote_stats_t s{};
    s.struct_size = sizeof(s) - 8;
    EXPECT_EQ(kvb_manager_get_remote_stats(m, &s), KVB_STATUS_STRUCT_SIZE);
    EXPECT_EQ(kvb_manager_remote_blocks_pending(m, nullptr, nullptr), KVB_STATUS_NULL_POINTER);
    kvb_manager_destroy(m);

    kvb_remote_tier_config_t rc{};
    ASSERT_EQ(kvb_remote_tier_config_init(&rc), KVB_OK);
    rc.urls = "redis://127.0.0.1:1";
    raw.struct_size = sizeof(raw);
    raw.remote = &rc;
    // No model id; then a TLS URL; then a bad policy.
    EXPECT_EQ(kvb_manager_create(&raw, &m), KVB_STATUS_INVALID_CONFIG);
    rc.model_id = "m";
    rc.urls = "rediss://127.0.0.1:1";
    EXPECT_EQ(kvb_manager_create(&raw, &m), KVB_STATUS_INVALID_CONFIG);
    EXPECT_NE(std::string(kvb_last_error_message()).find("TLS"), std::string::npos);
    rc.urls = "redis://127.0.0.1:1";
    rc.write_policy = 7;
    EXPECT_EQ(kvb_manager_create(&raw, &m), KVB_STATUS_INVALID_CONFIG);
    rc.write_policy = KVB_REMOTE_WRITE_ON_STORE;
    rc.io_timeout_ms = 0;
    EXPECT_EQ(kvb_manager_create(&raw, &m), KVB_STATUS_INVALID_CONFIG);
    // TLS files with a plain redis:// URL are a mistake, refused; a struct_size between the
    // versions is refused too.
    rc.io_timeout_ms = 100;
    rc.tls_ca_file = "/nonexistent/ca.crt";
    EXPECT_EQ(kvb_manager_create(&raw, &m), KVB_STATUS_INVALID_CONFIG);
    EXPECT_NE(std::string(kvb_last_error_message()).find("rediss://"), std::string::npos);
    rc.struct_size = static_cast<uint32_t>(offsetof(kvb_remote_tier_config_t, tls_cert_file));
    EXPECT_EQ(kvb_manager_create(&raw, &m), KVB_STATUS_STRUCT_SIZE);
    // A caller built before the TLS files: its struct ends before them (never read).
    rc.struct_size = static_cast<uint32_t>(offsetof(kvb_remote_tier_config_t, tls_ca_file));
    // An unreachable server is not an error at creation.
    ASSERT_EQ(kvb_manager_create(&raw, &m), KVB_OK) << kvb_last_error_message();
    ASSERT_EQ(kvb_manager_has_remote_tier(m, &has), KVB_OK);
    EXPECT_TRUE(has);
    kvb_manager_destroy(m);
}

}  // namespace
