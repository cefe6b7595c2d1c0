// replay/trace.hpp: the Mooncake FAST'25 trace format (JSON lines) and the token synthesis of the
// peer replay workload. No dependencies beyond the C++17 standard library.
//
// Trace: one JSON object per line with `timestamp` (ms), `input_length`, `output_length` and
// `hash_ids` (one id per 512-token prompt block; equal ids mean equal 512-token content). Other
// keys are skipped. Requests are numbered r = 0, 1, ... in file order.
//
// Tokens (all arithmetic on wrapping uint64):
//   prompt token i of a request  = splitmix64((hash_ids[i / 512] << 9) | (i % 512)) % 32000
//   generated token at position p = splitmix64((1 << 63) | (r << 32) | p) % 32000
// where p is the absolute sequence position the token occupies (input_length for the first one).
#ifndef KVBLOCK_REPLAY_TRACE_HPP
#define KVBLOCK_REPLAY_TRACE_HPP

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace replay {

/// Tokens per trace hash block (fixed by the Mooncake format).
constexpr int32_t kTraceBlockTokens = 512;
/// Vocabulary size of the synthesised tokens.
constexpr uint64_t kVocab = 32000;

/// One line of the trace.
struct TraceRequest {
    double timestamp_ms = 0;
    int32_t input_length = 0;
    int32_t output_length = 0;
    std::vector<uint64_t> hash_ids;
};

// ---- token synthesis ----------------------------------------------------------------------

constexpr uint64_t splitmix64(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/// Prompt token at position `i` (0-based) of a request.
inline int32_t prompt_token(const TraceRequest& req, size_t i) {
    uint64_t id = req.hash_ids[i / kTraceBlockTokens];
    return static_cast<int32_t>(splitmix64((id << 9) | (i % kTraceBlockTokens)) % kVocab);
}

/// Generated token of request `r` at absolute sequence position `p`.
inline int32_t output_token(uint64_t r, uint64_t p) {
    return static_cast<int32_t>(splitmix64((1ull << 63) | (r << 32) | p) % kVocab);
}

/// The whole prompt of a request.
inline std::vector<int32_t> synthesize_prompt(const TraceRequest& req) {
    std::vector<int32_t> tokens(static_cast<size_t>(req.input_length));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = prompt_token(req, i);
    return tokens;
}

/// Checks the token synthesis against known values (request 0 of the synthetic
/// trace has hash_ids 0, 1, 2, ... and input_length 40160); prints each check.
inline bool token_self_test(std::FILE* out) {
    bool ok = true;
    auto expect = [&](const char* what, uint64_t got, uint64_t want) {
        bool pass = got == want;
        ok = ok && pass;
        std::fprintf(out, "  %-40s %llu (expected %llu) %s\n", what,
                     static_cast<unsigned long long>(got), static_cast<unsigned long long>(want),
                     pass ? "ok" : "FAILED");
    };
    expect("splitmix64(0)", splitmix64(0), 0xe220a8397b1dcdafull);
    TraceRequest first;
    first.input_length = 40160;
    for (uint64_t i = 0; i < 79; ++i) first.hash_ids.push_back(i);
    const uint64_t head[] = {15535, 22465, 28110, 3053, 11978, 22618};
    for (size_t i = 0; i < 6; ++i) {
        std::string what = "request 0 prompt token " + std::to_string(i);
        expect(what.c_str(), static_cast<uint64_t>(prompt_token(first, i)), head[i]);
    }
    const uint64_t second_block[] = {19302, 4121, 13274};
    for (size_t i = 0; i < 3; ++i) {
        std::string what = "request 0 prompt token " + std::to_string(512 + i);
        expect(what.c_str(), static_cast<uint64_t>(prompt_token(first, 512 + i)), second_block[i]);
    }
    expect("output_token(0, 40160)", static_cast<uint64_t>(output_token(0, 40160)), 13311);
    expect("output_token(5, 100)", static_cast<uint64_t>(output_token(5, 100)), 18955);
    return ok;
}

// ---- JSON lines parser ----------------------------------------------------------------------

/// A minimal parser for one flat JSON object per line: number and array-of-number values are
/// read, strings / booleans / null / nested values are skipped. Errors name the line.
class TraceLineParser {
  public:
    TraceLineParser(const std::string& line, size_t line_no)
        : p_(line.data()), end_(line.data() + line.size()), line_no_(line_no) {}

    TraceRequest parse() {
        TraceRequest req;
        bool has_input = false, has_output = false, has_hashes = false;
        ws();
        expect('{');
        ws();
        if (peek() == '}') fail("empty object");
        while (true) {
            ws();
            std::string key = string();
            ws();
            expect(':');
            ws();
            if (key == "timestamp") {
                req.timestamp_ms = number();
            } else if (key == "input_length") {
                req.input_length = integer32("input_length");
                has_input = true;
            } else if (key == "output_length") {
                req.output_length = integer32("output_length");
                has_output = true;
            } else if (key == "hash_ids") {
                req.hash_ids = id_array();
                has_hashes = true;
            } else {
                skip_value();
            }
            ws();
            if (peek() == ',') {
                ++p_;
                continue;
            }
            expect('}');
            break;
        }
        ws();
        if (p_ != end_) fail("trailing characters after the object");
        if (!has_input || !has_output || !has_hashes) {
            fail("missing input_length, output_length or hash_ids");
        }
        if (req.input_length < 1) fail("input_length must be at least 1");
        if (req.output_length < 0) fail("output_length must not be negative");
        if (static_cast<int64_t>(req.hash_ids.size()) * kTraceBlockTokens < req.input_length) {
            fail("hash_ids cover fewer than input_length tokens");
        }
        return req;
    }

  private:
    [[noreturn]] void fail(const std::string& what) const {
        throw std::runtime_error("trace line " + std::to_string(line_no_) + ": " + what);
    }
    char peek() const { return p_ < end_ ? *p_ : '\0'; }
    void ws() {
        while (p_ < end_ && std::isspace(static_cast<unsigned char>(*p_))) ++p_;
    }
    void expect(char c) {
        if (peek() != c) fail(std::string("expected '") + c + "'");
        ++p_;
    }
    std::string string() {
        expect('"');
        std::string s;
        while (p_ < end_ && *p_ != '"') {
            if (*p_ == '\\') {  // keys of this format have no escapes; keep the escaped char
                ++p_;
                if (p_ == end_) break;
            }
            s.push_back(*p_++);
        }
        expect('"');
        return s;
    }
    double number() {
        const char* start = p_;
        if (peek() == '-' || peek() == '+') ++p_;
        while (p_ < end_ && (std::isdigit(static_cast<unsigned char>(*p_)) || *p_ == '.' ||
                             *p_ == 'e' || *p_ == 'E' || *p_ == '-' || *p_ == '+')) {
            ++p_;
        }
        if (p_ == start) fail("expected a number");
        std::string text(start, p_);
        char* stop = nullptr;
        double v = std::strtod(text.c_str(), &stop);
        if (stop != text.c_str() + text.size()) fail("bad number '" + text + "'");
        return v;
    }
    uint64_t unsigned_integer() {
        if (!std::isdigit(static_cast<unsigned char>(peek())))
            fail("expected a non-negative integer");
        uint64_t v = 0;
        while (p_ < end_ && std::isdigit(static_cast<unsigned char>(*p_))) {
            uint64_t d = static_cast<uint64_t>(*p_++ - '0');
            if (v > (UINT64_MAX - d) / 10) fail("integer out of range");
            v = v * 10 + d;
        }
        return v;
    }
    int32_t integer32(const char* what) {
        if (peek() == '-') fail(std::string(what) + " must not be negative");
        uint64_t v = unsigned_integer();
        if (v > static_cast<uint64_t>(INT32_MAX)) fail(std::string(what) + " out of range");
        return static_cast<int32_t>(v);
    }
    std::vector<uint64_t> id_array() {
        std::vector<uint64_t> ids;
        expect('[');
        ws();
        if (peek() == ']') {
            ++p_;
            return ids;
        }
        while (true) {
            ws();
            uint64_t id = unsigned_integer();
            // The token rule shifts the id left by 9 bits; larger ids would alias.
            if (id >> 55) fail("hash id too large");
            ids.push_back(id);
            ws();
            if (peek() == ',') {
                ++p_;
                continue;
            }
            expect(']');
            return ids;
        }
    }
    void skip_value() {
        char c = peek();
        if (c == '"') {
            string();
        } else if (c == '[' || c == '{') {
            int depth = 0;
            bool in_string = false;
            for (; p_ < end_; ++p_) {
                if (in_string) {
                    if (*p_ == '\\')
                        ++p_;
                    else if (*p_ == '"')
                        in_string = false;
                } else if (*p_ == '"') {
                    in_string = true;
                } else if (*p_ == '[' || *p_ == '{') {
                    ++depth;
                } else if ((*p_ == ']' || *p_ == '}') && --depth == 0) {
                    ++p_;
                    return;
                }
            }
            fail("unterminated value");
        } else if (std::isalpha(static_cast<unsigned char>(c))) {
            while (p_ < end_ && std::isalpha(static_cast<unsigned char>(*p_)))
                ++p_;  // true/false/null
        } else {
            number();
        }
    }

    const char* p_;
    const char* end_;
    size_t line_no_;
};

/// Reads the first `limit` requests (0 = all) of a trace file. Blank lines are skipped.
inline std::vector<TraceRequest> load_trace(const std::string& path, size_t limit) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open trace '" + path + "'");
    std::vector<TraceRequest> out;
    std::string line;
    size_t line_no = 0;
    while ((limit == 0 || out.size() < limit) && std::getline(in, line)) {
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        bool blank = true;
        for (char c : line) blank = blank && std::isspace(static_cast<unsigned char>(c));
        if (blank) continue;
        out.push_back(TraceLineParser(line, line_no).parse());
    }
    if (out.empty()) throw std::runtime_error("trace '" + path + "' has no requests");
    return out;
}

}  // namespace replay

#endif  // KVBLOCK_REPLAY_TRACE_HPP
