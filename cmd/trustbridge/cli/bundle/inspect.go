package bundle

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

func NewCmd(e cli.Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bundle",
		Short: "Work with SPIFFE bundle documents and bundle maps",
		Example: `  trustbridge bundle inspect --trust-domain example.org bundle.json
  trustbridge bundle list`,
	}
	cmd.AddCommand(newInspectCmd(e.Now))
	cmd.AddCommand(newBundleShowCmd(e), newBundleSetCmd(e), newBundleListCmd(e), newBundleDeleteCmd(e))
	return cmd
}

type inspectOptions struct {
	trustDomain string
	output      *cli.OutputFlag
	maxSize     int64
	allowEmpty  bool
	held        string
}

func newInspectCmd(now func() time.Time) *cobra.Command {
	var o inspectOptions
	cmd := &cobra.Command{
		Use:   "inspect FILE",
		Short: "Validate a SPIFFE bundle, bundle map or PEM roots and show what it trusts",
		Long: `Parse FILE ("-" for standard input) as a SPIFFE bundle document or, when it
has "trust_domains" and no "keys", as a SPIFFE bundle map, and decide it with
the code the federation poller runs on every fetched bundle: exit status 1,
with the poller's reason on stderr, exactly when the poller would refuse the
document from the --trust-domain's bundle endpoint. Each entry of a bundle
map is decided as if fetched from its trust domain's endpoint.

FILE may also hold PEM CA certificates (SPIRE's default format, spire-server
bundle show; Istio's root-cert.pem), detected by their content as bundle
set detects them: PEM does not name its trust domain, so --trust-domain is
required, and the certificates are decided as bundle set decides them (CA
certificates, none naming another trust domain, then the checks below).
TRUST_DOMAIN is example.org or spiffe://example.org.

What the poller checks: the strict parse (one "use" per key, no duplicate or
case-variant members, key sizes, CA certificates...), that no x5c
certificate names another trust domain, and that the bundle has an X.509 or
JWT authority (--allow-empty, as --federation-allow-empty, lets "keys": []
through). A bundle document does not name its trust domain: without
--trust-domain, a document whose x5c certificates name one is refused as the
poller would refuse it from any other trust domain's endpoint. The sequence
rules (a spiffe_sequence going back, or other keys under the same one) need
the bundle the poller holds; they apply only with --held. Transport rules
(HTTP status, Content-Type, TLS) have no meaning for a file.

Formats (-o):
  table   trust domain, sequence, refresh hint, one line per authority, warnings
  json    the same, as a JSON object for scripts
  yaml    the json object as YAML
  pem     the X.509 authorities as PEM (root-cert.pem); needs one trust domain
  spiffe  the canonical bundle document (or bundle map) trustbridge would serve

Fingerprints are SHA-256 in hex: of the certificate DER for x509-svid
authorities (as "openssl x509 -fingerprint -sha256" shows, without colons),
of the public key's SubjectPublicKeyInfo DER for jwt-svid and wit-svid.`,
		Example: `  trustbridge bundle inspect --trust-domain example.org bundle.json
  trustbridge bundle inspect -t example.org --held previous.json next.json   # would the poller move to next.json?
  curl -s https://peer.example/ | trustbridge bundle inspect -t peer.example -o pem - > root-cert.pem
  spire-server bundle show | trustbridge bundle inspect -t spiffe://peer.example -o spiffe -`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runInspect(cmd, args[0], o, now())
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.trustDomain, "trust-domain", "t", "", "trust domain the bundle belongs to (a bundle document does not name it; required for PEM); selects one entry of a bundle map")
	o.output = cli.AddOutputFlag(cmd, outputPEM, outputSPIFFE)
	f.Var(formatAlias{o.output, cmd}, "format", "same as -o")
	_ = f.MarkHidden("format")
	f.Int64Var(&o.maxSize, "max-size", bundledoc.DefaultMaxSize, "refuse documents larger than this many bytes")
	f.BoolVar(&o.allowEmpty, "allow-empty", false, `accept a bundle without X.509 or JWT authorities ("keys": []), as a server with --federation-allow-empty does`)
	f.StringVar(&o.held, "held", "", "bundle document the poller holds for --trust-domain (e.g. a previous inspect -o spiffe); the sequence rules are checked against it")
	return cmd
}

// formatAlias is inspect's --format, the flag -o replaced: it sets -o
// and warns on stderr, as the --json of addOutputFlag does.
type formatAlias struct {
	o   *cli.OutputFlag
	cmd *cobra.Command
}

func (a formatAlias) String() string { return a.o.Format }
func (a formatAlias) Type() string   { return "string" }
func (a formatAlias) Set(s string) error {
	a.o.Format = s
	fmt.Fprintf(a.cmd.ErrOrStderr(), "trustbridge: --format is deprecated and goes in a later release; use -o %s\n", s)
	return nil
}

// UnnamedTD stands in when a plain bundle is inspected without
// --trust-domain: the document does not carry its trust domain.
var UnnamedTD = spiffeid.RequireTrustDomainFromString("unnamed.invalid")

// Inspection is what inspect found, in the shape the json format prints.
type Inspection struct {
	Source   string          `json:"source"`
	Kind     string          `json:"kind"` // "bundle", "bundle_map" or "pem"
	Bundles  []bundleReport  `json:"bundles"`
	Warnings []warningReport `json:"warnings"`
	bundles  []*spiffebundle.Bundle
	// unnamed is set when a plain bundle was parsed without
	// --trust-domain, under the placeholder unnamedTD.
	unnamed bool
}

type bundleReport struct {
	TrustDomain        string            `json:"trust_domain"`
	Sequence           *uint64           `json:"sequence"`
	RefreshHintSeconds *int64            `json:"refresh_hint_seconds"`
	Authorities        []authorityReport `json:"authorities"`
}

type authorityReport struct {
	Kind      string     `json:"kind"` // x509-svid, jwt-svid, wit-svid
	Subject   string     `json:"subject,omitempty"`
	KeyID     string     `json:"key_id,omitempty"`
	KeyType   string     `json:"key_type"` // RSA, EC, Ed25519
	Curve     string     `json:"curve,omitempty"`
	KeySize   int        `json:"key_size"`
	NotBefore *time.Time `json:"not_before,omitempty"`
	NotAfter  *time.Time `json:"not_after,omitempty"`
	Expired   bool       `json:"expired,omitempty"`
	SHA256    string     `json:"sha256"`
	// JWT and WIT keys: the JWS algorithm the key implies and its RFC
	// 7638 thumbprint, as /v1/snapshot shows them.
	Algorithm  string `json:"algorithm,omitempty"`
	Thumbprint string `json:"thumbprint,omitempty"`
}

type warningReport struct {
	TrustDomain string `json:"trust_domain,omitempty"`
	Code        string `json:"code"`
	Message     string `json:"message"`
}

func runInspect(cmd *cobra.Command, path string, o inspectOptions, now time.Time) error {
	if o.maxSize <= 0 {
		return fmt.Errorf("--max-size must be positive, got %d", o.maxSize)
	}
	if err := o.output.Check(); err != nil {
		return err
	}
	var td spiffeid.TrustDomain
	if o.trustDomain != "" {
		var err error
		if td, err = bundledoc.ParseTrustDomain(o.trustDomain); err != nil {
			return fmt.Errorf("--trust-domain %q: %w", o.trustDomain, err)
		}
	}
	held, err := readHeld(o, td)
	if err != nil {
		return err
	}
	data, err := readInput(cmd.InOrStdin(), path, o.maxSize)
	if err != nil {
		return err
	}
	ins, err := inspect(path, data, td, verdictRules{held: held, allowEmpty: o.allowEmpty})
	if err != nil {
		return fmt.Errorf("%s: %w", displayName(path), err)
	}
	out := cmd.OutOrStdout()
	switch {
	case o.output.Common():
		ins.fill(now)
		return o.output.Write(out, ins, ins.writeTable)
	case o.output.Is(outputPEM):
		if len(ins.bundles) == 0 {
			return fmt.Errorf("%s is an empty bundle map: there are no roots to write", displayName(path))
		}
		if len(ins.bundles) != 1 {
			return fmt.Errorf("%s holds %d trust domains; PEM cannot say which root belongs to which, so pick one with --trust-domain", displayName(path), len(ins.bundles))
		}
		ins.warn(cmd.ErrOrStderr())
		b := ins.bundles[0]
		if n := len(b.JWTAuthorities()) + len(b.WITAuthorities()); n > 0 {
			fmt.Fprintf(cmd.ErrOrStderr(), "note: %d JWT/WIT authorities have no certificate and are not in the PEM output\n", n)
		}
		return writePEM(out, b)
	default: // spiffe
		ins.warn(cmd.ErrOrStderr())
		var doc []byte
		if ins.Kind == "bundle_map" && td.IsZero() {
			doc, err = bundledoc.MarshalMap(ins.bundles)
		} else {
			doc, err = bundledoc.Marshal(ins.bundles[0])
		}
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s\n", doc)
		return err
	}
}

func displayName(path string) string {
	if path == "-" {
		return "<stdin>"
	}
	return path
}

func readInput(stdin io.Reader, path string, limit int64) ([]byte, error) {
	if path == "-" {
		data, err := bundledoc.ReadLimited(stdin, limit)
		if err != nil {
			return nil, fmt.Errorf("<stdin>: %w", err)
		}
		return data, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := bundledoc.ReadLimited(f, limit)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return data, nil
}

// readHeld reads --held: the bundle the poller holds for td, itself
// checked as the poller checked it when it took it.
func readHeld(o inspectOptions, td spiffeid.TrustDomain) (*spiffebundle.Bundle, error) {
	if o.held == "" {
		return nil, nil
	}
	if td.IsZero() {
		return nil, errors.New("--held needs --trust-domain: a held bundle is the bundle of one trust domain")
	}
	f, err := os.Open(o.held)
	if err != nil {
		return nil, fmt.Errorf("--held: %w", err)
	}
	defer f.Close()
	data, err := bundledoc.ReadLimited(f, o.maxSize)
	if err != nil {
		return nil, fmt.Errorf("--held %s: %w", o.held, err)
	}
	b, _, _, err := federation.CheckDocument(td, data, nil, true)
	if err != nil {
		return nil, fmt.Errorf("--held %s: %w", o.held, err)
	}
	return b, nil
}

// verdictRules are the settings of the poller's verdict that inspect
// takes from flags.
type verdictRules struct {
	held       *spiffebundle.Bundle
	allowEmpty bool
}

// inspect parses data as a bundle map or a bundle and decides it as the
// poller would (federation.CheckDocument, CheckBundle). With a trust
// domain, a bundle map is narrowed to that entry.
func inspect(path string, data []byte, td spiffeid.TrustDomain, rules verdictRules) (*Inspection, error) {
	ins := &Inspection{Source: displayName(path), Warnings: []warningReport{}}
	var warnings []bundledoc.Warning
	if bundledoc.IsMap(data) {
		ins.Kind = "bundle_map"
		bundles, warns, err := bundledoc.ParseMap(data)
		if err != nil {
			return nil, err
		}
		warnings = warns
		for _, b := range bundles {
			if td.IsZero() || b.TrustDomain() == td {
				ins.bundles = append(ins.bundles, b)
			}
		}
		if ins.bundles == nil && !td.IsZero() {
			return nil, fmt.Errorf("bundle map has no trust domain %q", td.Name())
		}
		for _, b := range ins.bundles {
			if err := checkMapEntry(b, warnings, rules); err != nil {
				return nil, err
			}
		}
	} else if looksPEM(data) {
		ins.Kind = "pem"
		b, warns, err := inspectPEM(data, td, rules)
		if err != nil {
			return nil, err
		}
		ins.bundles, warnings = []*spiffebundle.Bundle{b}, warns
	} else {
		ins.Kind = "bundle"
		parseTD := td
		if td.IsZero() {
			parseTD, ins.unnamed = UnnamedTD, true
		}
		b, _, warns, err := federation.CheckDocument(parseTD, data, rules.held, rules.allowEmpty)
		if err != nil {
			if ins.unnamed && errors.Is(err, federation.ErrTrustDomainMismatch) {
				return nil, unnamedRefusal(data)
			}
			return nil, err
		}
		ins.bundles = []*spiffebundle.Bundle{b}
		warnings = warns
	}
	for _, w := range warnings {
		if !td.IsZero() && w.TrustDomain != "" && w.TrustDomain != td.Name() {
			continue
		}
		ins.Warnings = append(ins.Warnings, warningReport{TrustDomain: w.TrustDomain, Code: string(w.Code), Message: w.String()})
	}
	return ins, nil
}

// looksPEM says data is PEM, or text with PEM blocks (what openssl x509
// -text prints), rather than a JSON document: bundledoc.ParseAny tells
// the second what to keep.
func looksPEM(data []byte) bool {
	return bundledoc.IsPEM(data) || (bytes.Contains(data, []byte("-----BEGIN ")) && !bytes.HasPrefix(bytes.TrimSpace(data), []byte("{")))
}

// inspectPEM decides PEM CA certificates (SPIRE's and Istio's format) as
// the server decides them from bundle set: td's X.509 authorities, none
// naming another trust domain, then the poller's verdict. PEM does not
// name its trust domain, and a poller never fetches it: td is needed.
func inspectPEM(data []byte, td spiffeid.TrustDomain, rules verdictRules) (*spiffebundle.Bundle, []bundledoc.Warning, error) {
	if td.IsZero() {
		return nil, nil, errors.New("PEM certificates do not name their trust domain: pass it with -t/--trust-domain, as bundle set takes it")
	}
	b, warnings, err := bundledoc.ParseAny(td, data)
	if err == nil {
		err = federation.RefusedWarning(warnings)
	}
	if err == nil {
		_, err = federation.CheckBundle(rules.held, b, warnings, rules.allowEmpty)
	}
	return b, warnings, err
}

// unnamedRefusal explains the refusal of a plain bundle inspected without
// --trust-domain whose roots name a trust domain: the poller refuses it
// from every other trust domain's endpoint, and inspect cannot know which
// endpoint serves it. Naming the trust domain the roots name is a hint to
// the operator, never a guess inspect acts on.
func unnamedRefusal(data []byte) error {
	named := map[string]bool{}
	if b, _, err := bundledoc.Parse(UnnamedTD, data); err == nil {
		for _, c := range b.X509Authorities() {
			for _, u := range c.URIs {
				if id, err := spiffeid.FromURI(u); err == nil {
					named[id.TrustDomain().Name()] = true
				}
			}
		}
	}
	names := slices.Sorted(maps.Keys(named))
	hint := "pass the trust domain of the endpoint that serves it as --trust-domain"
	if len(names) == 1 {
		hint = fmt.Sprintf("pass --trust-domain %s if that is the trust domain of the endpoint that serves it", names[0])
	}
	return fmt.Errorf("a bundle document does not name its trust domain, and its x5c certificates name %s: the poller refuses it (%w) from the endpoint of any other; %s",
		strings.Join(names, ", "), federation.ErrTrustDomainMismatch, hint)
}

// checkMapEntry decides one entry of a bundle map as the poller would
// decide it fetched from its trust domain's endpoint.
func checkMapEntry(b *spiffebundle.Bundle, warnings []bundledoc.Warning, rules verdictRules) error {
	var own []bundledoc.Warning
	for _, w := range warnings {
		if w.TrustDomain == b.TrustDomain().Name() {
			own = append(own, w)
		}
	}
	if _, err := federation.CheckBundle(rules.held, b, own, rules.allowEmpty); err != nil {
		return fmt.Errorf("trust_domains[%q]: %w", b.TrustDomain().Name(), err)
	}
	return nil
}

func (ins *Inspection) warn(w io.Writer) {
	for _, wr := range ins.Warnings {
		fmt.Fprintf(w, "warning: %s\n", cli.Printable(wr.Message))
	}
}

// fill builds the printable reports.
func (ins *Inspection) fill(now time.Time) {
	ins.Bundles = make([]bundleReport, 0, len(ins.bundles))
	for _, b := range ins.bundles {
		r := bundleReport{TrustDomain: b.TrustDomain().Name(), Authorities: []authorityReport{}}
		if ins.unnamed {
			r.TrustDomain = ""
		}
		if seq, ok := b.SequenceNumber(); ok {
			r.Sequence = &seq
		}
		if hint, ok := b.RefreshHint(); ok {
			secs := int64(hint / time.Second)
			r.RefreshHintSeconds = &secs
		}
		for _, c := range b.X509Authorities() {
			typ, curve, size := describeKey(c.PublicKey)
			sum := sha256.Sum256(c.Raw)
			nb, na := c.NotBefore.UTC(), c.NotAfter.UTC()
			r.Authorities = append(r.Authorities, authorityReport{
				Kind: bundledoc.UseX509SVID, Subject: c.Subject.String(), KeyType: typ, Curve: curve, KeySize: size,
				NotBefore: &nb, NotAfter: &na, Expired: now.After(c.NotAfter), SHA256: hex.EncodeToString(sum[:]),
			})
		}
		for _, set := range []struct {
			kind string
			keys map[string]crypto.PublicKey
		}{{bundledoc.UseJWTSVID, b.JWTAuthorities()}, {bundledoc.UseWITSVID, b.WITAuthorities()}} {
			kids := make([]string, 0, len(set.keys))
			for kid := range set.keys {
				kids = append(kids, kid)
			}
			sort.Strings(kids)
			for _, kid := range kids {
				typ, curve, size := describeKey(set.keys[kid])
				ar := authorityReport{Kind: set.kind, KeyID: kid, KeyType: typ, Curve: curve, KeySize: size}
				if der, err := x509.MarshalPKIXPublicKey(set.keys[kid]); err == nil {
					sum := sha256.Sum256(der)
					ar.SHA256 = hex.EncodeToString(sum[:])
				}
				key := api.KeyAuthority("", kid, set.keys[kid])
				ar.Algorithm, ar.Thumbprint = key.Algorithm, key.Thumbprint
				r.Authorities = append(r.Authorities, ar)
			}
		}
		ins.Bundles = append(ins.Bundles, r)
	}
}

func describeKey(pub crypto.PublicKey) (typ, curve string, bits int) {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		return "RSA", "", k.N.BitLen()
	case *ecdsa.PublicKey:
		return "EC", k.Curve.Params().Name, k.Curve.Params().BitSize
	case ed25519.PublicKey:
		return "Ed25519", "", 256
	default:
		return fmt.Sprintf("%T", pub), "", 0
	}
}

func (ins *Inspection) writeTable(w io.Writer) error {
	ew := &errWriter{w: w}
	fmt.Fprintf(ew, "Source:  %s\nKind:    %s\n", ins.Source, ins.kindLabel())
	for _, b := range ins.Bundles {
		td := b.TrustDomain
		if td == "" {
			td = "(not given; pass --trust-domain)"
		}
		fmt.Fprintf(ew, "\nTrust domain:  %s\n", td)
		fmt.Fprintf(ew, "Sequence:      %s\n", optUint(b.Sequence))
		fmt.Fprintf(ew, "Refresh hint:  %s\n", ins.hintLabel(b))
		fmt.Fprintf(ew, "Authorities:   %d\n", len(b.Authorities))
		if len(b.Authorities) == 0 {
			fmt.Fprintf(ew, "               (none: this bundle trusts nothing)\n")
			continue
		}
		fmt.Fprintln(ew)
		tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "KIND\tSUBJECT / KEY ID\tKEY\tNOT BEFORE\tNOT AFTER\tSHA-256")
		for _, a := range b.Authorities {
			name := a.Subject
			if a.KeyID != "" {
				name = "kid " + a.KeyID
			}
			key := a.KeyType
			switch {
			case a.Curve != "":
				key += " " + a.Curve
			case a.KeyType == "RSA":
				key = fmt.Sprintf("RSA %d", a.KeySize)
			}
			nb, na := "-", "-"
			if a.NotBefore != nil {
				nb = a.NotBefore.Format(time.RFC3339)
				na = a.NotAfter.Format(time.RFC3339)
				if a.Expired {
					na += " (EXPIRED)"
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", a.Kind, cli.Printable(name), key, nb, na, a.SHA256)
		}
		_ = tw.Flush()
	}
	if len(ins.Warnings) > 0 {
		fmt.Fprintf(ew, "\nWarnings (%d):\n", len(ins.Warnings))
		for _, wr := range ins.Warnings {
			fmt.Fprintf(ew, "  %s\n", cli.Printable(wr.Message))
		}
	}
	return ew.err
}

func (ins *Inspection) kindLabel() string {
	switch ins.Kind {
	case "bundle_map":
		return fmt.Sprintf("SPIFFE bundle map (%d trust domains)", len(ins.Bundles))
	case "pem":
		return "PEM CA certificates"
	}
	return "SPIFFE bundle"
}

// hintLabel is b's refresh hint, or why it has none.
func (ins *Inspection) hintLabel(b bundleReport) string {
	switch {
	case b.RefreshHintSeconds != nil:
		return fmt.Sprintf("%ds (%s)", *b.RefreshHintSeconds, time.Duration(*b.RefreshHintSeconds)*time.Second)
	case ins.Kind == "bundle_map":
		return "(not used in bundle maps)"
	case ins.Kind == "pem":
		return "(none in PEM)"
	}
	return "(not set; consumers poll about every 5m)"
}

func optUint(v *uint64) string {
	if v == nil {
		return "(not set)"
	}
	return fmt.Sprint(*v)
}

// errWriter keeps the first write error so table output can be written
// without checking every Fprintf.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	if err != nil {
		e.err = err
	} else if n < len(p) {
		e.err = errors.New("short write")
	}
	return len(p), nil
}
