#include "common/security/channel_security.h"

#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/support/client_interceptor.h"

namespace tally {
namespace {

absl::Status CheckReadable(const char* flag, const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot read '", path, "'"));
  std::string first;
  std::getline(in, first);
  if (!absl::StartsWith(first, "-----BEGIN")) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": '", path, "' is not a PEM file"));
  }
  return absl::OkStatus();
}

// Adds the bearer token to the initial metadata of every call of the channel.
class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string* value) : value_(value) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({kAuthorizationKey, *value_});
    }
    methods->Proceed();
  }

 private:
  const std::string* value_;
};

class BearerTokenFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenFactory(const std::string& token) : value_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenInterceptor(&value_);
  }

 private:
  const std::string value_;  // Outlives the channel's interceptors: the channel owns this factory.
};

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateClientChannel(const std::string& target,
                                                                   const ClientSecurityOptions& security,
                                                                   grpc::ChannelArguments args) {
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (security.tls_cert.empty() != security.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (!security.tls_cert.empty() && security.tls_ca.empty()) {
    return absl::InvalidArgumentError("--tls-cert needs --tls-ca (the CA that signed tallyd's certificate)");
  }
  if (!security.tls_ca.empty()) {
    if (absl::Status s = CheckReadable("--tls-ca", security.tls_ca); !s.ok()) return s;
    std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider;
    if (security.tls_cert.empty()) {
      provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(security.tls_ca,
                                                                                     kCertificateRefreshSeconds);
    } else {
      if (absl::Status s = CheckReadable("--tls-cert", security.tls_cert); !s.ok()) return s;
      if (absl::Status s = CheckReadable("--tls-key", security.tls_key); !s.ok()) return s;
      provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
          security.tls_key, security.tls_cert, security.tls_ca, kCertificateRefreshSeconds);
    }
    grpc::experimental::TlsChannelCredentialsOptions options;
    options.set_certificate_provider(provider);
    options.watch_root_certs();
    if (!security.tls_cert.empty()) options.watch_identity_key_cert_pairs();
    creds = grpc::experimental::TlsCredentials(options);
    if (!security.tls_server_name.empty()) args.SetSslTargetNameOverride(security.tls_server_name);
  }
  if (security.token.empty()) return grpc::CreateCustomChannel(target, creds, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<BearerTokenFactory>(security.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, creds, args, std::move(interceptors));
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> CreateServerCredentials(const ServerTlsOptions& tls) {
  if (tls.cert.empty() && tls.key.empty()) {
    if (!tls.client_ca.empty()) return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
    return grpc::InsecureServerCredentials();
  }
  if (tls.cert.empty() || tls.key.empty()) return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  if (absl::Status s = CheckReadable("--tls-cert", tls.cert); !s.ok()) return s;
  if (absl::Status s = CheckReadable("--tls-key", tls.key); !s.ok()) return s;
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider;
  if (tls.client_ca.empty()) {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(tls.key, tls.cert,
                                                                                   kCertificateRefreshSeconds);
  } else {
    if (absl::Status s = CheckReadable("--tls-client-ca", tls.client_ca); !s.ok()) return s;
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(tls.key, tls.cert, tls.client_ca,
                                                                                   kCertificateRefreshSeconds);
  }
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!tls.client_ca.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

std::string BearerToken(absl::string_view value) {
  value = absl::StripAsciiWhitespace(value);
  constexpr absl::string_view kPrefix = "Bearer ";
  if (value.size() <= kPrefix.size() || !absl::EqualsIgnoreCase(value.substr(0, kPrefix.size()), kPrefix)) return "";
  return std::string(absl::StripAsciiWhitespace(value.substr(kPrefix.size())));
}

}  // namespace tally
