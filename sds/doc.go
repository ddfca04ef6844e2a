// Package sds is an Envoy Secret Discovery Service (v3) that hands
// workloads their X509-SVIDs and validation contexts holding the merged,
// per-trust-domain roots, including Envoy's SPIFFE certificate validator
// configuration.
//
// This package is being built; see the project issues for its scope.
//
// Reference: envoy.service.secret.v3.SecretDiscoveryService and
// envoy.extensions.transport_sockets.tls.v3.SPIFFECertValidatorConfig.
package sds
