// Who a call comes from: bearer tokens read from a file and checked before
// any handler runs, and the identity that owns a call's resident tensors.
//
// The token file holds one token per line, optionally followed by
// whitespace and the identity the token authenticates:
//
//   # comments and blank lines are ignored
//   3f9c1e0b8a7d4c2e9f6a5b4c3d2e1f00 alice
//   c0ffee00c0ffee00c0ffee00c0ffee00 batch-jobs
//   0123456789abcdef0123456789abcdef
//
// A token is 16 to 4096 printable ASCII characters without whitespace; an
// identity at most 128 of them. A token without an identity authenticates
// "token-" and the first 12 hex digits of the token's SHA-256. Tokens are
// held by their SHA-256 digest only.
#ifndef GPUCOMPUTE_SERVER_SERVICE_AUTH_H_
#define GPUCOMPUTE_SERVER_SERVICE_AUTH_H_

#include <sys/types.h>

#include <cstddef>
#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/server_context.h"

namespace gpucompute {

// The auth-context property that carries the identity a call's bearer
// token authenticates.
inline constexpr char kIdentityProperty[] = "gpucompute_identity";

// The tokens of one token file (format above).
class TokenSet {
 public:
  // Parses the contents of a token file. INVALID_ARGUMENT naming the line
  // (1-based) for a malformed token or identity, a token listed twice, or a
  // file without any token.
  static absl::StatusOr<TokenSet> Parse(absl::string_view contents);

  // The identity `token` authenticates; nullopt for a token not in the set.
  std::optional<std::string> IdentityOf(absl::string_view token) const;
  size_t size() const { return identity_by_digest_.size(); }

 private:
  // SHA-256 of the token (32 raw bytes) -> identity.
  absl::flat_hash_map<std::string, std::string> identity_by_digest_;
};

// Checks the "authorization: Bearer <token>" metadata of every call against
// a token file, as the gRPC server's AuthMetadataProcessor (gRPC runs it on
// secure ports only). A call without a known token fails UNAUTHENTICATED
// before any handler sees it; an accepted call's auth context gets
// kIdentityProperty. The file is read again on Reload() and when it changes
// (its modification time, size or inode; looked at on a call, at most once
// a second). A file that cannot be read or parsed then leaves the tokens as
// they were.
class TokenAuthenticator final : public grpc::AuthMetadataProcessor {
 public:
  // What the authenticator reports as it works (for the metrics); either may
  // be empty. Called on gRPC's threads and on Reload()'s caller, without the
  // authenticator's lock held; they must be thread-safe and quick.
  struct Events {
    // A call was refused: reason "missing" (no authorization metadata),
    // "malformed" (not "Bearer <token>") or "invalid" (unknown or revoked).
    std::function<void(absl::string_view reason)> refused;
    // The file was read again: `ok` with `tokens` now in force, or it failed
    // and the tokens in force (`tokens` of them) stay.
    std::function<void(bool ok, size_t tokens)> reloaded;
  };

  // Reads `path`. `exempt_health`: calls to grpc.health.v1.Health need no
  // token (probes). Errors: NOT_FOUND when the file cannot be read, the
  // parse errors of TokenSet::Parse; each names the file.
  static absl::StatusOr<std::shared_ptr<TokenAuthenticator>> Create(std::string path,
                                                                    bool exempt_health,
                                                                    Events events = {});
  TokenAuthenticator(const TokenAuthenticator&) = delete;
  TokenAuthenticator& operator=(const TokenAuthenticator&) = delete;

  // Reads the file again. On success the new tokens apply to every call
  // from now on and the number of tokens is returned; on error the tokens
  // stay as they were and the error (as Create's) is returned.
  absl::StatusOr<size_t> Reload();

  // Tokens in force.
  size_t size() const;

  // Cheap (a lookup; a stat at most once a second): runs on gRPC's thread.
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  struct FileStamp {
    timespec mtime{};
    off_t size = -1;
    ino_t inode = 0;
    bool operator==(const FileStamp& o) const {
      return mtime.tv_sec == o.mtime.tv_sec && mtime.tv_nsec == o.mtime.tv_nsec && size == o.size &&
             inode == o.inode;
    }
  };

  TokenAuthenticator(std::string path, bool exempt_health, Events events)
      : path_(std::move(path)), exempt_health_(exempt_health), events_(std::move(events)) {}

  // Reports a refusal and returns UNAUTHENTICATED with `message`.
  grpc::Status Refuse(absl::string_view reason, const char* message) const;

  // Reads and parses the file, with the stamp it had before the read.
  absl::StatusOr<std::shared_ptr<const TokenSet>> Read(FileStamp* stamp) const;
  // Reloads when the file's stamp changed, at most once a second.
  void ReloadIfChanged();

  const std::string path_;
  const bool exempt_health_;
  const Events events_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const TokenSet> tokens_ ABSL_GUARDED_BY(mu_);
  FileStamp stamp_ ABSL_GUARDED_BY(mu_);
  absl::Time last_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// The identity of a call's client: what its bearer token authenticates,
// else the common name (else the subject) of its verified TLS client
// certificate; "" when the call has neither (plaintext, or TLS without
// client certificates and without tokens).
std::string CallIdentity(const grpc::ServerContextBase& context);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_AUTH_H_
