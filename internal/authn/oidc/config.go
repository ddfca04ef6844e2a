package oidc

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/yamlcheck"
)

// Kind says how an issuer's tokens become identities.
type Kind string

const (
	// KindOIDC takes the SPIFFE ID from the issuer's template.
	KindOIDC Kind = "oidc"
	// KindKubernetes is a cluster's service account issuer: the ID is
	// spiffe://<td>/ns/<namespace>/sa/<name> from the kubernetes.io claims.
	KindKubernetes Kind = "kubernetes"
)

// IssuerConfig is one trusted token issuer.
type IssuerConfig struct {
	// Name identifies the issuer in metrics (label issuer), logs and
	// grants (authn.Grant.Ref): authn.CheckIssuerName, unique.
	Name string
	// Kind defaults to KindOIDC.
	Kind Kind
	// Issuer is an https URL, exactly the tokens' "iss" and the base of
	// the discovery document (OpenID Connect Discovery 1.0 §4.3).
	Issuer string
	// Audiences: a token must carry at least one of them; 1 to
	// MaxAudiences.
	Audiences []string
	// Algorithms the issuer's tokens may be signed with; empty means
	// RS256 and ES256. Only the RSA, ECDSA and RSA-PSS families: never
	// "none", never HMAC.
	Algorithms []string
	// CAFile names PEM roots for the issuer's TLS; the caller reads it
	// into Roots.
	CAFile string
	// Roots verify the issuer's TLS certificates; nil means system roots.
	Roots *x509.CertPool
	// AllowPrivateAddresses lets the issuer resolve to loopback and
	// link-local addresses (cloud metadata addresses never).
	AllowPrivateAddresses bool
	// Claims must all hold for a token to be accepted. KindOIDC requires
	// at least one (see errNoRules); for KindKubernetes they are optional,
	// and without a kubernetes.io.namespace rule the cluster is trusted
	// for every namespace and service account name.
	Claims []ClaimRule
	// SPIFFEID is the template of the identity (see the package doc):
	// required for KindOIDC, refused for KindKubernetes.
	SPIFFEID string
	// MaxRenewalLifetime bounds the renewal chains the issuer's tokens
	// start: CheckGrant refuses a grant older than this. Claim rules and
	// a remote cluster's service accounts cannot be re-checked offline,
	// so a chain must go back to a fresh token. Zero means
	// DefaultMaxRenewalLifetime; at most MaxMaxRenewalLifetime.
	MaxRenewalLifetime time.Duration
	// Line is the YAML line of the issuer's entry, which ParseConfig sets
	// so that New's errors (a template of another trust domain) can name
	// it; 0 for a configuration built in code.
	Line int
}

// Bounds of IssuerConfig.MaxRenewalLifetime.
const (
	DefaultMaxRenewalLifetime = 24 * time.Hour
	MaxMaxRenewalLifetime     = 8760 * time.Hour
)

// ClaimRule requires a claim to hold one of Values.
type ClaimRule struct {
	// Claim is a dotted path: "repository", "kubernetes.io.namespace".
	Claim string
	// Values: the claim (a string, or a number or boolean by its JSON
	// text) must equal one of them.
	Values []string
}

// Limits of a configuration, so that one issuer's checks stay cheap.
const (
	MaxAudiences    = 16
	maxIssuers      = 64
	maxClaimRules   = 32
	maxRuleValues   = 256
	maxValueLen     = 1024
	maxIssuerURLLen = 2048
	maxClaimPathLen = 256
)

// allowedAlgorithms are the asymmetric JWS algorithms (RFC 7518 §3.1):
// HMAC would let anyone who can verify also forge, and "none" proves
// nothing (RFC 8725 §3.1).
var allowedAlgorithms = []string{"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512"}

func defaultAlgorithms() []string { return []string{"RS256", "ES256"} }

// YAML keys.
const (
	keyIssuers      = "issuers"
	keyName         = "name"
	keyKind         = "kind"
	keyIssuer       = "issuer"
	keyAudiences    = "audiences"
	keyAlgorithms   = "algorithms"
	keyCAFile       = "caFile"
	keyAllowPrivate = "allowPrivateAddresses"
	keyClaims       = "claims"
	keySPIFFEID     = "spiffeID"
	keyClaim        = "claim"
	keyValues       = "values"
	keyMaxRenewal   = "maxRenewalLifetime"
)

var (
	topKeys    = []string{keyIssuers}
	issuerKeys = []string{keyName, keyKind, keyIssuer, keyAudiences, keyAlgorithms, keyCAFile, keyAllowPrivate, keyClaims, keySPIFFEID, keyMaxRenewal}
	ruleKeys   = []string{keyClaim, keyValues}
)

// ParseConfig parses a YAML document {issuers: [...]} (see the package
// doc). Unknown or duplicate keys, values of the wrong kind, anchors,
// aliases and more than one document are errors naming the line. An empty
// document yields no issuers. The trust domain of a template's literal
// "spiffe://<td>/" is checked by New.
func ParseConfig(data []byte) ([]IssuerConfig, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, fmt.Errorf("authn: oidc: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err == nil {
			err = yamlcheck.ErrorAt(&extra, "a second YAML document starts here; the file must hold exactly one")
		}
		return nil, fmt.Errorf("authn: oidc: %w", err)
	}
	if len(doc.Content) != 1 {
		return nil, nil
	}
	return ParseConfigNode(doc.Content[0])
}

// ParseConfigNode is ParseConfig for an already parsed mapping
// {issuers: [...]}: the value of the oidc key of the server's --config,
// whose line numbers its errors give. A nil or null node yields no
// issuers.
func ParseConfigNode(n *yaml.Node) ([]IssuerConfig, error) {
	out, err := parseNode(n)
	if err != nil {
		return nil, fmt.Errorf("authn: oidc: %w", err)
	}
	return out, nil
}

func parseNode(n *yaml.Node) ([]IssuerConfig, error) {
	if n == nil || yamlcheck.IsNull(n) {
		return nil, nil
	}
	if found, path := yamlcheck.Find(n, "", yamlcheck.IsAliasOrAnchor); found != nil {
		if path == "" {
			path = "the top level"
		}
		return nil, yamlcheck.ErrorAt(found, "%s: YAML anchors and aliases are not supported", path)
	}
	top, err := yamlcheck.Mapping(n, "the top level", topKeys)
	if err != nil {
		return nil, err
	}
	list := top[keyIssuers]
	if list == nil || yamlcheck.IsNull(list.Value) {
		return nil, nil
	}
	if list.Value.Kind != yaml.SequenceNode {
		return nil, yamlcheck.ErrorAt(list.Value, "%s must be a list, got %s", keyIssuers, yamlcheck.Describe(list.Value))
	}
	if len(list.Value.Content) > maxIssuers {
		return nil, yamlcheck.ErrorAt(list.Value, "%s has %d entries, more than %d", keyIssuers, len(list.Value.Content), maxIssuers)
	}
	return parseIssuers(list.Value.Content)
}

func parseIssuers(items []*yaml.Node) ([]IssuerConfig, error) {
	var (
		out     []IssuerConfig
		names   = map[string]int{}
		issuers = map[string]int{}
	)
	for i, item := range items {
		path := fmt.Sprintf("%s[%d]", keyIssuers, i)
		ic, m, err := parseIssuer(item, path)
		if err != nil {
			return nil, err
		}
		if line, dup := names[ic.Name]; dup {
			return nil, yamlcheck.ErrorAt(m[keyName].Value, "%s: name %q is already used at line %d", path, ic.Name, line)
		}
		names[ic.Name] = m[keyName].Value.Line
		if line, dup := issuers[ic.Issuer]; dup {
			return nil, yamlcheck.ErrorAt(m[keyIssuer].Value, "%s: issuer %q is already configured at line %d; one issuer URL has one entry", path, ic.Issuer, line)
		}
		issuers[ic.Issuer] = m[keyIssuer].Value.Line
		out = append(out, ic)
	}
	return out, nil
}

// parseIssuer reads one issuer; each value is checked where it is read,
// so an error names its line.
func parseIssuer(n *yaml.Node, path string) (IssuerConfig, map[string]*yamlcheck.Entry, error) {
	m, err := yamlcheck.Mapping(n, path, issuerKeys)
	if err != nil {
		return IssuerConfig{}, nil, err
	}
	for _, k := range []string{keyName, keyIssuer, keyAudiences} {
		if m[k] == nil {
			return IssuerConfig{}, nil, yamlcheck.ErrorAt(n, "%s: missing required key %q", path, k)
		}
	}
	ic := IssuerConfig{Kind: KindOIDC, Line: n.Line}
	steps := []func() error{
		func() error { return scalarField(m, path, keyName, &ic.Name, authn.CheckIssuerName) },
		func() error { return parseKind(m, path, &ic.Kind) },
		func() error { return scalarField(m, path, keyIssuer, &ic.Issuer, checkIssuerURL) },
		func() error { return listField(m, path, keyAudiences, &ic.Audiences, checkAudiences) },
		func() error { return listField(m, path, keyAlgorithms, &ic.Algorithms, checkAlgorithms) },
		func() error { return scalarField(m, path, keyCAFile, &ic.CAFile, checkCAFile) },
		func() error { return boolField(m, path, keyAllowPrivate, &ic.AllowPrivateAddresses) },
		func() error { return parseRules(m, path, &ic.Claims) },
		func() error { return parseTemplateField(m, path, &ic) },
		func() error { return durationField(m, path, keyMaxRenewal, &ic.MaxRenewalLifetime, checkMaxRenewal) },
		func() error { return requireRules(n, m, path, ic) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return IssuerConfig{}, nil, err
		}
	}
	return ic, m, nil
}

// errNoRules says why an oidc issuer needs claim rules. Its audience check
// is no fence: a shared public issuer signs a token with whatever
// audience its user asks for.
func errNoRules() error {
	return fmt.Errorf("kind %s requires at least one %s rule: a shared public issuer (GitHub Actions, GitLab, a cloud) "+
		"signs tokens with any audience for anyone, so without a rule every one of its users gets an identity here; "+
		"restrict it to your own tokens, e.g. claim repository_owner_id (GitHub's immutable organisation ID)", KindOIDC, keyClaims)
}

// requireRules refuses an oidc issuer without claim rules (errNoRules).
// It runs after the other checks of the entry, so that their errors,
// which say more about the entry, come first.
func requireRules(n *yaml.Node, m map[string]*yamlcheck.Entry, path string, ic IssuerConfig) error {
	if ic.Kind != KindOIDC || len(ic.Claims) > 0 {
		return nil
	}
	at := n
	if kv := m[keyClaims]; kv != nil {
		at = kv.Value
	}
	return yamlcheck.ErrorAt(at, "%s: %w", path, errNoRules())
}

func parseKind(m map[string]*yamlcheck.Entry, path string, kind *Kind) error {
	var s string
	if err := scalarField(m, path, keyKind, &s, func(s string) error {
		if Kind(s) != KindOIDC && Kind(s) != KindKubernetes {
			return fmt.Errorf("is not one of %s, %s", KindOIDC, KindKubernetes)
		}
		return nil
	}); err != nil || s == "" {
		return err
	}
	*kind = Kind(s)
	return nil
}

func parseTemplateField(m map[string]*yamlcheck.Entry, path string, ic *IssuerConfig) error {
	kv := m[keySPIFFEID]
	switch {
	case ic.Kind == KindKubernetes && kv != nil:
		return yamlcheck.ErrorAt(kv.Key, "%s: %s is not allowed for kind %s: the ID is spiffe://<td>/ns/<namespace>/sa/<name> from the token", path, keySPIFFEID, KindKubernetes)
	case ic.Kind == KindOIDC && kv == nil:
		return yamlcheck.ErrorAt(m[keyName].Key, "%s: kind %s requires %s (a SPIFFE ID template)", path, KindOIDC, keySPIFFEID)
	}
	return scalarField(m, path, keySPIFFEID, &ic.SPIFFEID, func(s string) error {
		_, err := parseTemplate(s)
		return err
	})
}

func parseRules(m map[string]*yamlcheck.Entry, path string, rules *[]ClaimRule) error {
	kv := m[keyClaims]
	if kv == nil {
		return nil
	}
	if kv.Value.Kind != yaml.SequenceNode {
		return yamlcheck.ErrorAt(kv.Value, "%s.%s must be a list, got %s", path, keyClaims, yamlcheck.Describe(kv.Value))
	}
	if len(kv.Value.Content) > maxClaimRules {
		return yamlcheck.ErrorAt(kv.Value, "%s.%s has %d rules, more than %d", path, keyClaims, len(kv.Value.Content), maxClaimRules)
	}
	seen := map[string]int{}
	for i, item := range kv.Value.Content {
		rpath := fmt.Sprintf("%s.%s[%d]", path, keyClaims, i)
		rm, err := yamlcheck.Mapping(item, rpath, ruleKeys)
		if err != nil {
			return err
		}
		for _, k := range ruleKeys {
			if rm[k] == nil {
				return yamlcheck.ErrorAt(item, "%s: missing required key %q", rpath, k)
			}
		}
		var r ClaimRule
		if err := scalarField(rm, rpath, keyClaim, &r.Claim, checkRuleClaim); err != nil {
			return err
		}
		if line, dup := seen[r.Claim]; dup {
			return yamlcheck.ErrorAt(rm[keyClaim].Value, "%s: claim %q already has a rule at line %d; list every accepted value in one rule", rpath, r.Claim, line)
		}
		seen[r.Claim] = rm[keyClaim].Value.Line
		if err := listField(rm, rpath, keyValues, &r.Values, checkRuleValues); err != nil {
			return err
		}
		*rules = append(*rules, r)
	}
	return nil
}

// scalarField reads an optional string key through check.
func scalarField(m map[string]*yamlcheck.Entry, path, key string, dst *string, check func(string) error) error {
	kv := m[key]
	if kv == nil {
		return nil
	}
	if problem := yamlcheck.StringProblem(kv.Value); problem != "" {
		return yamlcheck.ErrorAt(kv.Value, "%s.%s %s", path, key, problem)
	}
	if err := check(kv.Value.Value); err != nil {
		return yamlcheck.ErrorAt(kv.Value, "%s.%s: %w", path, key, err)
	}
	*dst = kv.Value.Value
	return nil
}

// listField reads an optional list of strings through check.
func listField(m map[string]*yamlcheck.Entry, path, key string, dst *[]string, check func([]string) error) error {
	kv := m[key]
	if kv == nil {
		return nil
	}
	if kv.Value.Kind != yaml.SequenceNode {
		return yamlcheck.ErrorAt(kv.Value, "%s.%s must be a list, got %s", path, key, yamlcheck.Describe(kv.Value))
	}
	if len(kv.Value.Content) > maxRuleValues {
		return yamlcheck.ErrorAt(kv.Value, "%s.%s has %d entries, more than %d", path, key, len(kv.Value.Content), maxRuleValues)
	}
	out := make([]string, 0, len(kv.Value.Content))
	for i, v := range kv.Value.Content {
		if problem := yamlcheck.StringProblem(v); problem != "" {
			return yamlcheck.ErrorAt(v, "%s.%s[%d] %s", path, key, i, problem)
		}
		out = append(out, v.Value)
	}
	if err := check(out); err != nil {
		return yamlcheck.ErrorAt(kv.Value, "%s.%s: %w", path, key, err)
	}
	*dst = out
	return nil
}

// durationField reads an optional Go duration string ("24h", "90m")
// through check.
func durationField(m map[string]*yamlcheck.Entry, path, key string, dst *time.Duration, check func(time.Duration) error) error {
	var s string
	if err := scalarField(m, path, key, &s, func(string) error { return nil }); err != nil || m[key] == nil {
		return err
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return yamlcheck.ErrorAt(m[key].Value, "%s.%s: %q is not a duration such as 24h or 90m", path, key, truncate(s, 32))
	}
	if err := check(d); err != nil {
		return yamlcheck.ErrorAt(m[key].Value, "%s.%s: %w", path, key, err)
	}
	*dst = d
	return nil
}

func checkMaxRenewal(d time.Duration) error {
	if d <= 0 || d > MaxMaxRenewalLifetime {
		return fmt.Errorf("must be more than 0 and at most %s (a year), got %s; leave it out for the default %s", fmtHours(MaxMaxRenewalLifetime), d, fmtHours(DefaultMaxRenewalLifetime))
	}
	return nil
}

// fmtHours writes a whole number of hours as the YAML would: "24h".
func fmtHours(d time.Duration) string {
	return fmt.Sprintf("%dh", int64(d/time.Hour))
}

func boolField(m map[string]*yamlcheck.Entry, path, key string, dst *bool) error {
	kv := m[key]
	if kv == nil {
		return nil
	}
	if kv.Value.Kind != yaml.ScalarNode || kv.Value.ShortTag() != "!!bool" {
		return yamlcheck.ErrorAt(kv.Value, "%s.%s must be true or false, got %s", path, key, yamlcheck.Describe(kv.Value))
	}
	return kv.Value.Decode(dst)
}

// checkIssuerURL accepts an absolute https URL with a host and no
// userinfo, query or fragment: the base the discovery path is appended to
// (OpenID Connect Discovery 1.0 §4), compared with "iss" byte for byte.
func checkIssuerURL(s string) error {
	if s == "" || len(s) > maxIssuerURLLen {
		return fmt.Errorf("issuer URL must be 1 to %d bytes", maxIssuerURLLen)
	}
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return fmt.Errorf("issuer URL %q does not parse: %w", redact(s), err)
	case u.Scheme != "https":
		return fmt.Errorf("issuer URL %q must use https", redact(s))
	case u.User != nil:
		return fmt.Errorf("issuer URL %q must not carry userinfo", redact(s))
	case u.Host == "" || u.Hostname() == "":
		return fmt.Errorf("issuer URL %q has no host", redact(s))
	case strings.ContainsAny(s, "?#"):
		return fmt.Errorf("issuer URL %q must not have a query or fragment (OpenID Connect Discovery 1.0 §4.1)", redact(s))
	case strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r >= 0x7f }):
		return fmt.Errorf("issuer URL %q must be printable ASCII without spaces", redact(s))
	}
	return nil
}

// redact drops userinfo from a URL for an error message.
func redact(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		u.User = url.User("REDACTED")
		return u.String()
	}
	if len(s) > 256 {
		return s[:256] + "…"
	}
	return s
}

func checkAudiences(auds []string) error {
	if len(auds) == 0 || len(auds) > MaxAudiences {
		return fmt.Errorf("must list 1 to %d audiences, got %d", MaxAudiences, len(auds))
	}
	for i, a := range auds {
		if a == "" || len(a) > maxValueLen {
			return fmt.Errorf("audience %d must be 1 to %d bytes", i, maxValueLen)
		}
		if slices.Contains(auds[:i], a) {
			return fmt.Errorf("audience %q is listed twice", a)
		}
	}
	return nil
}

func checkAlgorithms(algs []string) error {
	if len(algs) == 0 {
		return fmt.Errorf("is empty; leave it out for the default %s", strings.Join(defaultAlgorithms(), ", "))
	}
	for i, a := range algs {
		if !slices.Contains(allowedAlgorithms, a) {
			return fmt.Errorf("algorithm %q is not allowed (allowed: %s; never none or HMAC)", truncate(a, 32), strings.Join(allowedAlgorithms, ", "))
		}
		if slices.Contains(algs[:i], a) {
			return fmt.Errorf("algorithm %q is listed twice", a)
		}
	}
	return nil
}

func checkCAFile(s string) error {
	if s == "" {
		return errors.New("is empty; leave it out for the system roots")
	}
	return nil
}

// checkRuleClaim is checkClaimPath for a rule, which must not be about
// a registered claim the issuer's own settings already check (iss, aud)
// or that says nothing about who the token is for (times, jti): a rule
// "iss is GitHub's" would satisfy the one-rule requirement of an oidc
// issuer while still admitting every GitHub user.
func checkRuleClaim(p string) error {
	if err := checkClaimPath(p); err != nil {
		return err
	}
	switch p {
	case "iss", "aud", "exp", "nbf", "iat", "jti":
		return fmt.Errorf("claim %q cannot have a rule: it is checked by the issuer's settings or says nothing about whom the token is for; "+
			"restrict a claim naming the subject (e.g. sub, repository_owner_id, kubernetes.io.namespace)", p)
	}
	return nil
}

// checkClaimPath accepts a dotted path of non-empty keys.
func checkClaimPath(p string) error {
	if p == "" || len(p) > maxClaimPathLen {
		return fmt.Errorf("claim path must be 1 to %d bytes", maxClaimPathLen)
	}
	for i := 0; i < len(p); i++ {
		if !claimPathByte(p[i]) {
			return fmt.Errorf("claim path %q: byte %d is not one of A-Z a-z 0-9 %s", truncate(p, 64), i+1, claimPathPunct)
		}
	}
	if slices.Contains(strings.Split(p, "."), "") {
		return fmt.Errorf("claim path %q has an empty key (leading, trailing or double dot)", truncate(p, 64))
	}
	return nil
}

// claimPathPunct is the punctuation a claim name may hold besides the
// dots that separate keys: enough for namespaced claims
// ("https://example.com/roles") and nothing that could read as a
// function, pipeline or quote.
const claimPathPunct = "_-.:/@#~+"

func claimPathByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte(claimPathPunct, c) >= 0
}

func checkRuleValues(vals []string) error {
	if len(vals) == 0 {
		return errors.New("must list at least one value")
	}
	for i, v := range vals {
		if len(v) > maxValueLen {
			return fmt.Errorf("value %d is %d bytes, more than %d", i, len(v), maxValueLen)
		}
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// check validates c as New receives it: what ParseConfig checks, for a
// configuration built in code. It applies the Kind, Algorithms and
// MaxRenewalLifetime defaults.
func (c *IssuerConfig) check() error {
	if c.Kind == "" {
		c.Kind = KindOIDC
	}
	if len(c.Algorithms) == 0 {
		c.Algorithms = defaultAlgorithms()
	}
	if c.MaxRenewalLifetime == 0 {
		c.MaxRenewalLifetime = DefaultMaxRenewalLifetime
	}
	checks := []struct {
		field string
		err   error
	}{
		{keyName, authn.CheckIssuerName(c.Name)},
		{keyIssuer, checkIssuerURL(c.Issuer)},
		{keyAudiences, checkAudiences(c.Audiences)},
		{keyAlgorithms, checkAlgorithms(c.Algorithms)},
		{keyClaims, checkRules(c.Claims)},
		{keyMaxRenewal, checkMaxRenewal(c.MaxRenewalLifetime)},
	}
	for _, ch := range checks {
		if ch.err != nil {
			return fmt.Errorf("%s: %w", ch.field, ch.err)
		}
	}
	switch {
	case c.Kind != KindOIDC && c.Kind != KindKubernetes:
		return fmt.Errorf("kind %q is not one of %s, %s", truncate(string(c.Kind), 32), KindOIDC, KindKubernetes)
	case c.Kind == KindKubernetes && c.SPIFFEID != "":
		return fmt.Errorf("%s is not allowed for kind %s", keySPIFFEID, KindKubernetes)
	case c.Kind == KindOIDC && c.SPIFFEID == "":
		return fmt.Errorf("kind %s requires %s", KindOIDC, keySPIFFEID)
	case c.Kind == KindOIDC && len(c.Claims) == 0:
		return fmt.Errorf("%s: %w", keyClaims, errNoRules())
	}
	return nil
}

func checkRules(rules []ClaimRule) error {
	if len(rules) > maxClaimRules {
		return fmt.Errorf("%d rules, more than %d", len(rules), maxClaimRules)
	}
	for i, r := range rules {
		if err := checkRuleClaim(r.Claim); err != nil {
			return fmt.Errorf("rule %d: %w", i, err)
		}
		if len(r.Values) > maxRuleValues {
			return fmt.Errorf("rule %d: %d values, more than %d", i, len(r.Values), maxRuleValues)
		}
		if err := checkRuleValues(r.Values); err != nil {
			return fmt.Errorf("rule %d (%s): %w", i, r.Claim, err)
		}
		if slices.ContainsFunc(rules[:i], func(o ClaimRule) bool { return o.Claim == r.Claim }) {
			return fmt.Errorf("rule %d: claim %q has two rules", i, r.Claim)
		}
	}
	return nil
}
