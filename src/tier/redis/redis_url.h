// The Redis URL (kcache/redis.h): redis://[:password@]host[:port][/db][?...]
// and redis+cluster://host:port[,host:port...][?...]; each option of the
// query goes through set_remote_option, whose one table (kRemoteOptions,
// redis_url.cc) names every option, its form and the field it sets.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kcache/redis.h"
#include "kcache/status.h"

namespace kcache::redis_url {

// A whole decimal number, nothing else.
bool parse_u64(std::string_view s, uint64_t* out);

struct Endpoint {
  std::string host;
  int port = 6379;
};

struct ParsedUrl {
  bool cluster = false;
  std::vector<Endpoint> seeds;
  std::string user, password;
  int db = 0;
  RedisTierOptions opt;
};

// The URL's parts, with its query applied over `base`. Errors name the
// problem, never the URL (it may hold a password).
Expected<ParsedUrl> parse_url(const std::string& url, const RedisTierOptions& base);

}  // namespace kcache::redis_url
