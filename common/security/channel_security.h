// Transport security and call credentials shared by tally, tally-worker and tallyd (SECURITY.md):
// TLS or mutual TLS with gRPC's own credentials, certificate files watched so that rotation needs
// no restart, and a bearer token on every call.
#ifndef TALLY_COMMON_SECURITY_CHANNEL_SECURITY_H_
#define TALLY_COMMON_SECURITY_CHANNEL_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace tally {

// How often watched certificate files are re-read (a changed file takes effect within this).
inline constexpr unsigned kCertificateRefreshSeconds = 2;

struct ClientSecurityOptions {
  std::string tls_ca;           // PEM bundle of the CA that signed tallyd's certificate; empty = plaintext.
  std::string tls_cert;         // This process's certificate (mutual TLS), with tls_key.
  std::string tls_key;
  std::string tls_server_name;  // Name to check tallyd's certificate against; empty = the target's host.
  std::string token;            // Sent as "authorization: Bearer <token>" on every call; empty = none.
};

// A channel to `target` with these credentials. Errors (a file that cannot be read, a certificate
// without its key) name the flag and the file.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateClientChannel(const std::string& target,
                                                                   const ClientSecurityOptions& security,
                                                                   grpc::ChannelArguments args);

struct ServerTlsOptions {
  std::string cert;       // PEM certificate chain; empty = plaintext.
  std::string key;        // Its private key.
  std::string client_ca;  // Non-empty: clients must present a certificate signed by this CA.
};

// Plaintext credentials when `tls.cert` is empty, else TLS (mTLS with a client CA).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> CreateServerCredentials(const ServerTlsOptions& tls);

// The name of the bearer-token metadata key, and the token in a value, or "" if it is not one.
inline constexpr char kAuthorizationKey[] = "authorization";
std::string BearerToken(absl::string_view authorization_value);

}  // namespace tally

#endif  // TALLY_COMMON_SECURITY_CHANNEL_SECURITY_H_
