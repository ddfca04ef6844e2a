// Package identityapi is the generated code of trustbridge's own gRPC
// service, trustbridge.identity.v1.IdentityService (identity.proto): JWT-SVID
// minting and a per-caller stream of trust bundles, served beside Istio's
// certificate service and authenticated like it. `make proto` regenerates
// it; nothing here is written by hand but this file and limits.go.
package identityapi
