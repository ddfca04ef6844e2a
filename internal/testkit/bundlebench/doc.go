// Package bundlebench holds the whole-process bundle endpoint benchmark
// (issue 20 item 6): the real `trustbridge server` binary, from
// TRUSTBRIDGE_BIN, against a static-bytes net/http handler in a process of
// its own with the same TLS configuration, certificate and bytes, loaded by
// 16 keep-alive HTTPS connections over loopback from this process, the
// two alternated in rounds within one run. It has no code outside its
// tests; without TRUSTBRIDGE_BIN the benchmark skips.
//
//	make bench    # builds bin/trustbridge and sets TRUSTBRIDGE_BIN
//	TRUSTBRIDGE_BIN=$PWD/bin/trustbridge go test -run '^$' -bench WholeProcess ./internal/testkit/bundlebench
//
// TRUSTBRIDGE_BIN_BASE, when set, names a second binary (a build of an
// earlier commit, say) that joins the same rounds, for an A/B comparison
// of two versions on the same machine load.
//
// Spec: SPIFFE Federation §4 (the bundle endpoint).
package bundlebench
