// Package hsmtest gives tests a fresh SoftHSM2 token: a PKCS#11 module
// backed by files in the test's temporary directory, so tests of
// ca/pkcs11 run against a real PKCS#11 implementation without hardware.
//
// Token skips the test when SoftHSM2 is not installed (make hsm-tools
// installs it), and fails it instead when RequireEnv is "require", as
// make unit sets it.
package hsmtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// RequireEnv set to "require" turns a missing SoftHSM2 into a failure.
const RequireEnv = "TRUSTBRIDGE_HSM_TESTS"

// Label and PIN of the token Token creates.
const (
	Label = "trustbridge-test"
	PIN   = "1234"
	SOPIN = "5678"
)

// modules are where Debian (and Ubuntu) put SoftHSM2's PKCS#11 module.
var modules = []string{
	"/usr/lib/softhsm/libsofthsm2.so",
	"/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
	"/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so",
}

// Module returns the path of SoftHSM2's PKCS#11 module, skipping (or
// failing, under RequireEnv=require) the test when it is missing.
func Module(t testing.TB) string {
	t.Helper()
	for _, m := range modules {
		if _, err := os.Stat(m); err == nil {
			return m
		}
	}
	missing(t, "no SoftHSM2 PKCS#11 module in "+modules[0])
	return ""
}

// Token initializes a new SoftHSM2 token labelled Label with user PIN PIN
// in a directory of the test's own, points SOFTHSM2_CONF at it (t.Setenv,
// so the test may not be parallel), and returns the module path, label and
// PIN to open it with.
func Token(t testing.TB) (module, label, pin string) {
	t.Helper()
	module = Module(t)
	util, err := exec.LookPath("softhsm2-util")
	if err != nil {
		missing(t, "no softhsm2-util in PATH")
	}
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.Mkdir(tokens, 0o700); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "softhsm2.conf")
	body := "directories.tokendir = " + tokens + "\nobjectstore.backend = file\nlog.level = ERROR\n"
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	setenv(t, "SOFTHSM2_CONF", conf)
	out, err := exec.Command(util, "--init-token", "--free", "--label", Label,
		"--pin", PIN, "--so-pin", SOPIN).CombinedOutput()
	if err != nil {
		t.Fatalf("softhsm2-util --init-token: %v\n%s", err, out)
	}
	return module, Label, PIN
}

func setenv(t testing.TB, k, v string) {
	t.Helper()
	if s, ok := t.(interface{ Setenv(string, string) }); ok {
		s.Setenv(k, v)
		return
	}
	t.Fatalf("hsmtest: %T cannot set %s", t, k)
}

func missing(t testing.TB, why string) {
	t.Helper()
	if os.Getenv(RequireEnv) == "require" {
		t.Fatalf("SoftHSM2 required (%s=require) but %s (run make hsm-tools)", RequireEnv, why)
	}
	t.Skipf("%s (run make hsm-tools, or apt-get install softhsm2)", why)
}

// Slot returns the slot number SoftHSM2 gave the token labelled label
// (SoftHSM2 renumbers a slot when its token is initialized), read from
// softhsm2-util --show-slots under the SOFTHSM2_CONF Token set.
func Slot(t testing.TB, label string) int {
	t.Helper()
	out, err := exec.Command("softhsm2-util", "--show-slots").CombinedOutput()
	if err != nil {
		t.Fatalf("softhsm2-util --show-slots: %v\n%s", err, out)
	}
	slot := -1
	for _, line := range strings.Split(string(out), "\n") {
		if n, ok := strings.CutPrefix(line, "Slot "); ok {
			slot, _ = strconv.Atoi(strings.TrimSpace(n))
		}
		if l, ok := strings.CutPrefix(strings.TrimSpace(line), "Label:"); ok && strings.TrimSpace(l) == label {
			return slot
		}
	}
	t.Fatalf("softhsm2-util --show-slots lists no token labelled %q:\n%s", label, out)
	return -1
}
