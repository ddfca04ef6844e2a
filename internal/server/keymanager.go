package server

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/spf13/pflag"

	"github.com/trustbridge/trustbridge/ca"
)

// pinEnv is the environment variable that holds the PKCS#11 user PIN when
// --pkcs11-pin-file is not given.
const pinEnv = "TRUSTBRIDGE_PKCS11_PIN"

// KeyManagerConfig are the flags that put the CA's keys in a key manager
// (an HSM through PKCS#11) instead of the state.
type KeyManagerConfig struct {
	kind       string // "" or "pkcs11"
	module     string
	tokenLabel string
	slot       int // -1: unset
	pinFile    string
	requireHSM bool

	// manager is the opened key manager (runServer), nil without one.
	manager ca.KeyManager
}

// openPKCS11 opens a PKCS#11 token from the flags; nil in a build without
// the PKCS#11 key manager.
var openPKCS11 func(o KeyManagerConfig, getenv func(string) string, logger *slog.Logger) (ca.KeyManager, func(), error)

func addKeyManagerFlags(f *pflag.FlagSet, o *KeyManagerConfig) {
	f.StringVar(&o.kind, "key-manager", "", `where new root and JWT-SVID keys are made and kept: "" (in the CA state: --data-dir files 0600, or the state Secret) or pkcs11 (an HSM; the state then records only a reference to each key)`)
	f.StringVar(&o.module, "pkcs11-module", "", "with --key-manager pkcs11: path of the PKCS#11 library, e.g. /usr/lib/softhsm/libsofthsm2.so")
	f.StringVar(&o.tokenLabel, "pkcs11-token-label", "", "with --key-manager pkcs11: label of the token that holds the CA's keys")
	f.IntVar(&o.slot, "pkcs11-slot", -1, "with --key-manager pkcs11: slot id of the token, instead of --pkcs11-token-label (-1: unset)")
	f.StringVar(&o.pinFile, "pkcs11-pin-file", "", "with --key-manager pkcs11: file holding the token's user PIN (else env "+pinEnv+")")
	f.BoolVar(&o.requireHSM, "require-hsm", false, "refuse to start unless the CA's keys live in a key manager (--key-manager); trustbridge audit reports own keys outside one as key_outside_hsm")
}

// check finds what open would refuse, named by flag, without opening
// anything.
func (o KeyManagerConfig) check(getenv func(string) string, caDir string) error {
	switch o.kind {
	case "":
		return o.checkUnused()
	case "pkcs11":
	default:
		return fmt.Errorf("--key-manager %q: unknown; use pkcs11, or leave it empty to keep keys in the CA state", o.kind)
	}
	if caDir != "" {
		return errors.New("--key-manager does not combine with --ca-dir: a plug-in CA's key is in its directory; drop one of them")
	}
	if o.module == "" {
		return errors.New("--key-manager pkcs11 needs --pkcs11-module, the PKCS#11 library (e.g. /usr/lib/softhsm/libsofthsm2.so)")
	}
	if o.slot < -1 {
		return fmt.Errorf("--pkcs11-slot %d: give a slot id (0 or more), or -1 for none", o.slot)
	}
	if o.tokenLabel == "" && o.slot < 0 {
		return errors.New("--key-manager pkcs11 needs --pkcs11-token-label (or --pkcs11-slot) naming the token")
	}
	if o.tokenLabel != "" && o.slot >= 0 {
		return errors.New("--pkcs11-token-label and --pkcs11-slot both select the token; give one of them")
	}
	if o.pinFile == "" && getenv(pinEnv) == "" {
		return fmt.Errorf("--key-manager pkcs11 needs the token's PIN: --pkcs11-pin-file FILE, or env %s", pinEnv)
	}
	return nil
}

// describe says where the CA's keys are, for the banner: the token, or
// beside the state (inSecret: the state Secret).
func (o KeyManagerConfig) describe(inSecret bool) string {
	switch {
	case o.kind != "" && o.tokenLabel != "":
		return fmt.Sprintf("keys in PKCS#11 token %q (module %s)", o.tokenLabel, o.module)
	case o.kind != "":
		return fmt.Sprintf("keys in PKCS#11 slot %d (module %s)", o.slot, o.module)
	case inSecret:
		return "keys in the Secret"
	}
	return "keys in files there (mode 0600)"
}

// checkUnused refuses PKCS#11 flags without --key-manager, and
// --require-hsm without a key manager. (--pkcs11-slot is not among them:
// options built without flags hold slot 0.)
func (o KeyManagerConfig) checkUnused() error {
	if o.requireHSM {
		return errors.New("--require-hsm: keys must live in a key manager; add --key-manager pkcs11 --pkcs11-module LIB --pkcs11-token-label LABEL --pkcs11-pin-file FILE")
	}
	for _, f := range []struct {
		name string
		set  bool
	}{{"pkcs11-module", o.module != ""}, {"pkcs11-token-label", o.tokenLabel != ""}, {"pkcs11-pin-file", o.pinFile != ""}} {
		if f.set {
			return fmt.Errorf("--%s is set but --key-manager is not; add --key-manager pkcs11 or drop it", f.name)
		}
	}
	return nil
}

// open opens the key manager the flags name; nil (and a no-op close)
// without one.
func (o KeyManagerConfig) open(getenv func(string) string, caDir string, logger *slog.Logger) (ca.KeyManager, func(), error) {
	if err := o.check(getenv, caDir); err != nil {
		return nil, nil, err
	}
	if o.kind == "" {
		return nil, func() {}, nil
	}
	if openPKCS11 == nil {
		return nil, nil, errors.New("--key-manager pkcs11: this trustbridge was built without the PKCS#11 key manager")
	}
	return openPKCS11(o, getenv, logger)
}
