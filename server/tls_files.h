// The server's TLS files, read again while it runs and handed to gRPC only
// as whole, consistent sets.
#ifndef GPUCOMPUTE_SERVER_TLS_FILES_H_
#define GPUCOMPUTE_SERVER_TLS_FILES_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gpucompute {

// The contents of the file at `path`; INVALID_ARGUMENT naming --`flag` when
// it cannot be read or is empty.
absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag);

// OK when `cert_pem` holds a PEM certificate (chain) and `key_pem` the
// unencrypted PEM private key of its first certificate; INVALID_ARGUMENT
// naming --tls_cert or --tls_key otherwise.
absl::Status CheckKeyMatchesCertificate(const std::string& cert_pem, const std::string& key_pem);

// A private copy of --tls_cert, --tls_key and --tls_client_ca for gRPC's
// FileWatcherCertificateProvider (which reads the paths below every second).
// The operator's files are read every `interval` and on Reload(); a set whose
// key is the certificate's (and whose CA file holds a certificate) replaces
// the copy in one rename of a directory link, so gRPC never reads half a
// rotation: while the key and the certificate are replaced one after the
// other (certbot, a hand-made rotation), the previous pair is still served.
// The copy lives in a directory of its own under $TMPDIR (else /tmp),
// "gpucompute-tls-<pid>-*", mode 0700, removed by the destructor; Create
// removes those of this user's servers that are no longer running (killed).
class TlsFiles {
 public:
  // Reads and checks the files (errors name the flag); an empty `ca_path`:
  // no client CA. `interval` > 0.
  static absl::StatusOr<std::unique_ptr<TlsFiles>> Create(std::string cert_path,
                                                          std::string key_path, std::string ca_path,
                                                          absl::Duration interval);
  ~TlsFiles();
  TlsFiles(const TlsFiles&) = delete;
  TlsFiles& operator=(const TlsFiles&) = delete;

  // Paths of the copy, for the provider ("" for the CA when there is none).
  std::string cert_path() const { return current_ + "/cert.pem"; }
  std::string key_path() const { return current_ + "/key.pem"; }
  std::string ca_path() const { return has_ca_ ? current_ + "/ca.pem" : std::string(); }

  // Reads the operator's files now. OK with `*replaced` telling whether they
  // changed (the copy now holds them); an error, naming the flag, leaves the
  // copy as it was.
  absl::Status Reload(bool* replaced);

 private:
  TlsFiles(std::string cert_path, std::string key_path, std::string ca_path, std::string dir);
  // Writes version `n` of the copy and points current_ at it.
  absl::Status Publish(const std::string& cert, const std::string& key, const std::string& ca,
                       int n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Watch(absl::Duration interval);

  const std::string cert_source_, key_source_, ca_source_;
  const std::string dir_;
  const std::string current_;  // dir_/current, a link to dir_/v<n>
  const bool has_ca_;

  absl::Mutex mu_;
  std::string cert_ ABSL_GUARDED_BY(mu_), key_ ABSL_GUARDED_BY(mu_), ca_ ABSL_GUARDED_BY(mu_);
  int version_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);  // logged once until it changes
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_TLS_FILES_H_
