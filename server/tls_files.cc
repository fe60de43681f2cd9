#include "server/tls_files.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/status_macros.h"

namespace gpucompute {
namespace {

using Bio = std::unique_ptr<BIO, decltype(&BIO_free)>;

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
}

// OK when `pem` holds at least one PEM certificate.
absl::Status CheckCertificates(const std::string& pem, const char* flag) {
  Bio bio = MemoryBio(pem);
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr, X509_free);
  if (cert == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": no PEM certificate in the file"));
  }
  return absl::OkStatus();
}

absl::Status WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  if (chmod(path.c_str(), 0600) != 0) return absl::InternalError(absl::StrCat("chmod ", path));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  if (!in || contents.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": cannot read ", path));
  }
  return contents.str();
}

absl::Status CheckKeyMatchesCertificate(const std::string& cert_pem, const std::string& key_pem) {
  Bio cert_bio = MemoryBio(cert_pem), key_bio = MemoryBio(key_pem);
  if (cert_bio == nullptr || key_bio == nullptr) return absl::ResourceExhaustedError("BIO_new");
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr), X509_free);
  if (cert == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError("--tls_cert: no PEM certificate in the file");
  }
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr), EVP_PKEY_free);
  if (key == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError("--tls_key: no unencrypted PEM private key in the file");
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError("--tls_key: not the private key of --tls_cert");
  }
  return absl::OkStatus();
}

namespace {

// Removes the copies of servers that are no longer running (killed before
// their destructor ran): directories "gpucompute-tls-<pid>-*" of this user
// under `tmp` whose process is gone.
void RemoveStaleCopies(const std::string& tmp) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(tmp, error)) {
    const std::string name = entry.path().filename().string();
    constexpr char kPrefix[] = "gpucompute-tls-";
    if (name.rfind(kPrefix, 0) != 0) continue;
    const pid_t pid = static_cast<pid_t>(std::atol(name.c_str() + sizeof(kPrefix) - 1));
    struct stat st;
    if (pid <= 0 || pid == getpid() || lstat(entry.path().c_str(), &st) != 0 ||
        !S_ISDIR(st.st_mode) || st.st_uid != getuid()) {
      continue;
    }
    if (kill(pid, 0) != 0 && errno == ESRCH) {
      std::error_code ignored;
      std::filesystem::remove_all(entry.path(), ignored);
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<TlsFiles>> TlsFiles::Create(std::string cert_path,
                                                           std::string key_path,
                                                           std::string ca_path,
                                                           absl::Duration interval) {
  const char* env = std::getenv("TMPDIR");
  const std::string tmp = env != nullptr && *env != '\0' ? env : "/tmp";
  RemoveStaleCopies(tmp);
  std::string pattern = absl::StrCat(tmp, "/gpucompute-tls-", getpid(), "-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat(
        "--tls_reload_interval: cannot make a private directory for the TLS files under ", tmp,
        " (set TMPDIR, or --tls_reload_interval=0)"));
  }
  std::unique_ptr<TlsFiles> files(new TlsFiles(std::move(cert_path), std::move(key_path),
                                               std::move(ca_path), std::move(pattern)));
  bool replaced = false;
  RETURN_IF_ERROR(files->Reload(&replaced));
  files->watcher_ = std::thread([f = files.get(), interval] { f->Watch(interval); });
  return files;
}

TlsFiles::TlsFiles(std::string cert_path, std::string key_path, std::string ca_path,
                   std::string dir)
    : cert_source_(std::move(cert_path)),
      key_source_(std::move(key_path)),
      ca_source_(std::move(ca_path)),
      dir_(std::move(dir)),
      current_(dir_ + "/current"),
      has_ca_(!ca_source_.empty()) {}

TlsFiles::~TlsFiles() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (watcher_.joinable()) watcher_.join();
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

absl::Status TlsFiles::Reload(bool* replaced) {
  *replaced = false;
  std::string cert, key, ca;
  ASSIGN_OR_RETURN(cert, ReadPem(cert_source_, "tls_cert"));
  ASSIGN_OR_RETURN(key, ReadPem(key_source_, "tls_key"));
  RETURN_IF_ERROR(CheckKeyMatchesCertificate(cert, key));
  if (has_ca_) {
    ASSIGN_OR_RETURN(ca, ReadPem(ca_source_, "tls_client_ca"));
    RETURN_IF_ERROR(CheckCertificates(ca, "tls_client_ca"));
  }
  absl::MutexLock lock(&mu_);
  if (version_ > 0 && cert == cert_ && key == key_ && ca == ca_) return absl::OkStatus();
  RETURN_IF_ERROR(Publish(cert, key, ca, version_ + 1));
  cert_ = std::move(cert);
  key_ = std::move(key);
  ca_ = std::move(ca);
  *replaced = version_ > 1;
  return absl::OkStatus();
}

absl::Status TlsFiles::Publish(const std::string& cert, const std::string& key,
                               const std::string& ca, int n) {
  const std::string version = absl::StrCat("v", n);
  const std::string dir = absl::StrCat(dir_, "/", version);
  std::error_code error;
  std::filesystem::create_directory(dir, error);
  if (error) return absl::InternalError(absl::StrCat("cannot make ", dir, ": ", error.message()));
  RETURN_IF_ERROR(WriteFile(dir + "/key.pem", key));
  RETURN_IF_ERROR(WriteFile(dir + "/cert.pem", cert));
  if (has_ca_) RETURN_IF_ERROR(WriteFile(dir + "/ca.pem", ca));
  // A new link, renamed over the old one: readers see the old set or the new.
  const std::string link = absl::StrCat(dir_, "/current.", n);
  if (symlink(version.c_str(), link.c_str()) != 0 || rename(link.c_str(), current_.c_str()) != 0) {
    unlink(link.c_str());
    return absl::InternalError(absl::StrCat("cannot point ", current_, " at ", dir));
  }
  // The version before the previous one: no reader can still be in it.
  if (n > 2) std::filesystem::remove_all(absl::StrCat(dir_, "/v", n - 2), error);
  version_ = n;
  return absl::OkStatus();
}

void TlsFiles::Watch(absl::Duration interval) {
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), interval)) {
    mu_.Unlock();
    bool replaced = false;
    absl::Status status = Reload(&replaced);
    if (replaced) {
      std::fprintf(stderr, "gpucompute-server: TLS files changed: new connections get them\n");
    }
    mu_.Lock();
    const std::string error = status.ok() ? "" : status.ToString();
    if (!error.empty() && error != last_error_) {
      std::fprintf(stderr, "gpucompute-server: TLS files: %s; the previous ones stay in use\n",
                   error.c_str());
    }
    last_error_ = error;
  }
}

}  // namespace gpucompute
