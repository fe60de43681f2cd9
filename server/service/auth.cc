#include "server/service/auth.h"

#include <openssl/sha.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace gpucompute {
namespace {

constexpr size_t kMinTokenBytes = 16;
constexpr size_t kMaxTokenBytes = 4096;
constexpr size_t kMaxIdentityBytes = 128;
constexpr char kHealthPathPrefix[] = "/grpc.health.v1.Health/";

std::string Sha256(absl::string_view text) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

bool Printable(absl::string_view text) {
  for (char c : text) {
    if (c <= 0x20 || c > 0x7e) return false;
  }
  return true;
}

std::string ToString(grpc::string_ref ref) { return std::string(ref.data(), ref.size()); }

}  // namespace

absl::StatusOr<TokenSet> TokenSet::Parse(absl::string_view contents) {
  TokenSet set;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(contents, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto invalid = [line_number](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_number, ": ", what));
    };
    if (fields.size() > 2) {
      return invalid("expected a token, optionally followed by an identity, and nothing else");
    }
    const absl::string_view token = fields[0];
    if (token.size() < kMinTokenBytes || token.size() > kMaxTokenBytes || !Printable(token)) {
      return invalid(absl::StrCat("a token is ", kMinTokenBytes, " to ", kMaxTokenBytes,
                                  " printable ASCII characters"));
    }
    std::string digest = Sha256(token);
    std::string identity;
    if (fields.size() == 2) {
      if (fields[1].size() > kMaxIdentityBytes || !Printable(fields[1])) {
        return invalid(absl::StrCat("an identity is at most ", kMaxIdentityBytes,
                                    " printable ASCII characters"));
      }
      identity = std::string(fields[1]);
    } else {
      identity = absl::StrCat("token-", absl::BytesToHexString(digest).substr(0, 12));
    }
    if (!set.identity_by_digest_.emplace(std::move(digest), std::move(identity)).second) {
      return invalid("the token is listed twice");
    }
  }
  if (set.identity_by_digest_.empty()) {
    return absl::InvalidArgumentError("no token (every call would be refused)");
  }
  return set;
}

std::optional<std::string> TokenSet::IdentityOf(absl::string_view token) const {
  auto it = identity_by_digest_.find(Sha256(token));
  if (it == identity_by_digest_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<std::shared_ptr<TokenAuthenticator>> TokenAuthenticator::Create(std::string path,
                                                                               bool exempt_health,
                                                                               Events events) {
  std::shared_ptr<TokenAuthenticator> authenticator(
      new TokenAuthenticator(std::move(path), exempt_health, std::move(events)));
  FileStamp stamp;
  absl::StatusOr<std::shared_ptr<const TokenSet>> tokens = authenticator->Read(&stamp);
  if (!tokens.ok()) return tokens.status();
  absl::MutexLock lock(&authenticator->mu_);
  authenticator->tokens_ = *std::move(tokens);
  authenticator->stamp_ = stamp;
  authenticator->last_check_ = absl::Now();
  return authenticator;
}

absl::StatusOr<std::shared_ptr<const TokenSet>> TokenAuthenticator::Read(FileStamp* stamp) const {
  struct stat st;
  if (stat(path_.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("token file ", path_, ": cannot read it"));
  }
  stamp->mtime = st.st_mtim;
  stamp->size = st.st_size;
  stamp->inode = st.st_ino;
  std::ifstream in(path_, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  if (!in) return absl::NotFoundError(absl::StrCat("token file ", path_, ": cannot read it"));
  absl::StatusOr<TokenSet> tokens = TokenSet::Parse(contents.str());
  if (!tokens.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", path_, ": ", tokens.status().message()));
  }
  return std::make_shared<const TokenSet>(*std::move(tokens));
}

absl::StatusOr<size_t> TokenAuthenticator::Reload() {
  FileStamp stamp;
  absl::StatusOr<std::shared_ptr<const TokenSet>> tokens = Read(&stamp);
  absl::StatusOr<size_t> result;
  size_t in_force = 0;
  {
    absl::MutexLock lock(&mu_);
    last_check_ = absl::Now();
    // A file that failed is not read again on every call until it changes.
    stamp_ = stamp;
    if (tokens.ok()) {
      tokens_ = *std::move(tokens);
      result = tokens_->size();
    } else {
      result = tokens.status();
    }
    in_force = tokens_->size();
  }
  if (events_.reloaded) events_.reloaded(result.ok(), in_force);
  return result;
}

grpc::Status TokenAuthenticator::Refuse(absl::string_view reason, const char* message) const {
  if (events_.refused) events_.refused(reason);
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, message);
}

size_t TokenAuthenticator::size() const {
  absl::MutexLock lock(&mu_);
  return tokens_->size();
}

void TokenAuthenticator::ReloadIfChanged() {
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now - last_check_ < absl::Seconds(1)) return;
    last_check_ = now;
    struct stat st;
    FileStamp current;
    if (stat(path_.c_str(), &st) == 0) {
      current.mtime = st.st_mtim;
      current.size = st.st_size;
      current.inode = st.st_ino;
    }
    if (current == stamp_) return;
  }
  absl::StatusOr<size_t> reloaded = Reload();
  if (reloaded.ok()) {
    std::fprintf(stderr, "gpucompute-server: token file %s changed: %zu tokens\n", path_.c_str(),
                 *reloaded);
  } else {
    std::fprintf(stderr, "gpucompute-server: %s; the tokens stay as they were\n",
                 reloaded.status().ToString().c_str());
  }
}

grpc::Status TokenAuthenticator::Process(const InputMetadata& auth_metadata,
                                         grpc::AuthContext* context,
                                         OutputMetadata* consumed_auth_metadata,
                                         OutputMetadata* /*response_metadata*/) {
  if (exempt_health_) {
    auto path = auth_metadata.find(":path");
    if (path != auth_metadata.end() &&
        absl::StartsWith(ToString(path->second), kHealthPathPrefix)) {
      return grpc::Status::OK;
    }
  }
  auto header = auth_metadata.find("authorization");
  if (header == auth_metadata.end()) {
    return Refuse("missing",
                  "missing \"authorization: Bearer <token>\" metadata; this server "
                  "requires a bearer token");
  }
  const std::string value = ToString(header->second);
  absl::string_view token = value;
  if (!absl::ConsumePrefix(&token, "Bearer ") && !absl::ConsumePrefix(&token, "bearer ")) {
    return Refuse("malformed", "authorization metadata: expected \"Bearer <token>\"");
  }
  token = absl::StripAsciiWhitespace(token);
  ReloadIfChanged();
  std::shared_ptr<const TokenSet> tokens;
  {
    absl::MutexLock lock(&mu_);
    tokens = tokens_;
  }
  std::optional<std::string> identity = tokens->IdentityOf(token);
  if (!identity) return Refuse("invalid", "the bearer token is not valid (unknown or revoked)");
  context->AddProperty(kIdentityProperty, *identity);
  // Handlers never see the token.
  consumed_auth_metadata->insert({"authorization", value});
  return grpc::Status::OK;
}

std::string CallIdentity(const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return "";
  for (const char* property : {kIdentityProperty, "x509_common_name", "x509_subject"}) {
    std::vector<grpc::string_ref> values = auth->FindPropertyValues(property);
    if (!values.empty()) return ToString(values.front());
  }
  return "";
}

}  // namespace gpucompute
