// Package bundleserver serves SPIFFE bundle endpoints over HTTPS, in the
// https_web (Web PKI) and https_spiffe (X509-SVID) profiles: the local
// trust domain's bundle at a configured path, any bundle the server holds
// at /bundles/{trustDomain}, and a SPIFFE bundle map of them at
// /bundle-map. Documents are rendered with internal/bundledoc once per
// change, in Server.Update, and every request writes the same bytes with
// a strong ETag, so If-None-Match polls cost a 304. The local bundle is
// never served empty by accident: before the source has one the server
// answers 503 with a plain-text body (go-spiffe's FetchBundle ignores
// status codes, so an error body must not parse as a bundle). TLS follows
// Mozilla's intermediate profile, client certificates are never
// requested, and the serving certificate comes from GetCertificate on
// every handshake, so it rotates without a restart. FileSource serves a
// bundle document from a file for relays and offline CAs; FileCertificate
// and ACME supply https_web certificates. Endpoint wires a Server to its
// sources as a composition root would: the CA's bundle unless a file
// replaces it (static mode), relayed files beside federated bundles, and
// an update on every change signal (NewEndpoint, Endpoint.Run). A local
// source that is also a RevocationSource has the authorities it revoked
// published in the document's trustbridge_revoked member (issue 38), and
// a relayed file's member is served as the file has it.
// Server.Fetchers tells, per trust domain, which clients fetched its
// bundle document, when last and at which spiffe_sequence: a bounded
// record by remote IP address, so behind a load balancer it shows the
// balancer (X-Forwarded-For is not trusted).
//
//	srv, err := bundleserver.New(bundleserver.Config{
//		TrustDomain:    td,
//		Local:          authority, // anything with Bundle() *spiffebundle.Bundle
//		Others:         relayed, // func() []*spiffebundle.Bundle, as their endpoints published them
//		ServeOthers:    serveFederated,
//		GetCertificate: svids.GetCertificate,
//		Logger:         logger,
//		Registerer:     reg,
//	})
//	if err != nil {
//		return err
//	}
//	caChanges := authority.Subscribe()
//	go func() { // re-render on every change of any source
//		for {
//			select {
//			case <-ctx.Done():
//				return
//			case <-caChanges:
//			case <-store.Changes():
//			}
//			_ = srv.Update() // logged; the last good documents stay served
//		}
//	}()
//	return srv.Serve(ctx, ln) // graceful shutdown when ctx ends
//
// Specs: SPIFFE Federation §4 (bundle endpoint), §5 (Mozilla intermediate
// TLS), §5.2.1.3 and §5.2.2.3 (serving https_web and https_spiffe: GET,
// no client authentication, application/json); SPIFFE Trust Domain and
// Bundle §4 and §5 (bundle and bundle map formats); RFC 9110 §8.8.3 and
// §13.1.2 (ETag, If-None-Match), RFC 9111 §5.2.2.1 (max-age).
// https://github.com/spiffe/spiffe/blob/main/standards/SPIFFE_Federation.md#4-spiffe-bundle-endpoint
package bundleserver
