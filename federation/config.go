package federation

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/yamlcheck"
)

// Config is the federation part of the configuration file.
type Config struct {
	Endpoints []Endpoint
	// Warnings are problems that did not stop the configuration from
	// loading, such as bootstrap bundle elements the spec says to ignore.
	// The caller should surface them.
	Warnings []string
}

// YAML keys. Item and profile keys are those of spire-controller-manager's
// ClusterFederatedTrustDomain spec, so an existing CR's spec can be pasted
// in; trustDomainBundleFile and refresh are ours.
const (
	keyFederation            = "federation"
	keyTrustDomain           = "trustDomain"
	keyBundleEndpointURL     = "bundleEndpointURL"
	keyBundleEndpointProfile = "bundleEndpointProfile"
	keyTrustDomainBundle     = "trustDomainBundle"
	keyTrustDomainBundleFile = "trustDomainBundleFile"
	keyRefresh               = "refresh"
	keyType                  = "type"
	keyEndpointSPIFFEID      = "endpointSPIFFEID"
	keyMin                   = "min"
	keyMax                   = "max"
)

var (
	topKeys     = []string{keyFederation}
	itemKeys    = []string{keyTrustDomain, keyBundleEndpointURL, keyBundleEndpointProfile, keyTrustDomainBundle, keyTrustDomainBundleFile, keyRefresh}
	profileKeys = []string{keyType, keyEndpointSPIFFEID}
	refreshKeys = []string{keyMin, keyMax}
)

// ConfigEntry is one endpoint in the schema ParseConfig reads (the spec
// of a ClusterFederatedTrustDomain): what EntryOf writes, for the run-time
// federation's file and its resources.
type ConfigEntry struct {
	TrustDomain           string         `json:"trustDomain" yaml:"trustDomain"`
	BundleEndpointURL     string         `json:"bundleEndpointURL" yaml:"bundleEndpointURL"`
	BundleEndpointProfile ConfigProfile  `json:"bundleEndpointProfile" yaml:"bundleEndpointProfile"`
	TrustDomainBundle     string         `json:"trustDomainBundle,omitempty" yaml:"trustDomainBundle,omitempty"`
	Refresh               *ConfigRefresh `json:"refresh,omitempty" yaml:"refresh,omitempty"`
}

// ConfigProfile is a ConfigEntry's bundleEndpointProfile.
type ConfigProfile struct {
	Type             string `json:"type" yaml:"type"`
	EndpointSPIFFEID string `json:"endpointSPIFFEID,omitempty" yaml:"endpointSPIFFEID,omitempty"`
}

// ConfigRefresh is a ConfigEntry's refresh bounds, as Go durations.
type ConfigRefresh struct {
	Min string `json:"min,omitempty" yaml:"min,omitempty"`
	Max string `json:"max,omitempty" yaml:"max,omitempty"`
}

// EntryOf is ep in the configuration schema, its bootstrap bundle inline
// as its canonical document: ParseConfig reads back the same endpoint.
func EntryOf(ep Endpoint) (ConfigEntry, error) {
	e := ConfigEntry{
		TrustDomain: ep.TrustDomain.Name(), BundleEndpointURL: ep.URL.String(),
		BundleEndpointProfile: ConfigProfile{Type: string(ep.Profile)},
	}
	if ep.Profile == ProfileHTTPSSPIFFE {
		e.BundleEndpointProfile.EndpointSPIFFEID = ep.EndpointSPIFFEID.String()
	}
	if ep.BootstrapBundle != nil {
		doc, err := bundledoc.Marshal(ep.BootstrapBundle)
		if err != nil {
			return ConfigEntry{}, fmt.Errorf("%s: bootstrap bundle: %w", ep.TrustDomain.Name(), err)
		}
		e.TrustDomainBundle = string(doc)
	}
	if r := ep.Refresh; r.Min > 0 || r.Max > 0 {
		e.Refresh = &ConfigRefresh{}
		if r.Min > 0 {
			e.Refresh.Min = r.Min.String()
		}
		if r.Max > 0 {
			e.Refresh.Max = r.Max.String()
		}
	}
	return e, nil
}

// ParseConfig parses a YAML federation file:
//
//	federation:
//	  - trustDomain: example.org
//	    bundleEndpointURL: https://example.org:8443/
//	    bundleEndpointProfile:
//	      type: https_spiffe
//	      endpointSPIFFEID: spiffe://example.org/spire/server
//	    trustDomainBundleFile: bundles/example.json
//	    refresh: {min: 30s, max: 1h}
//
// Trust domains, URLs and SPIFFE IDs obey the same rules as in
// ParseEndpoints. Unknown or duplicate keys, values of the wrong kind, YAML
// aliases and more than one YAML document are errors: a misspelt key in a
// security configuration must not be silently ignored. Errors name the line
// and the item by its 0-based index ("federation[1]"). An empty file, or a
// null or empty federation list, yields no endpoints.
//
// readFile loads trustDomainBundleFile paths exactly as written; resolving
// relative paths is the caller's business. With a nil readFile,
// trustDomainBundleFile is an error.
func ParseConfig(data []byte, readFile func(path string) ([]byte, error)) (*Config, error) {
	cfg, err := parseConfig(data, readFile)
	if err != nil {
		return nil, fmt.Errorf("federation: %w", err)
	}
	return cfg, nil
}

func parseConfig(data []byte, readFile func(string) ([]byte, error)) (*Config, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return &Config{}, nil
		}
		return nil, err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, err
		}
		return nil, yamlcheck.ErrorAt(&extra, "a second YAML document starts here; the file must hold exactly one")
	}
	if len(doc.Content) != 1 {
		return &Config{}, nil
	}
	root := doc.Content[0]
	if err := noAlias(root, ""); err != nil {
		return nil, err
	}
	if yamlcheck.IsNull(root) {
		return &Config{}, nil
	}
	top, err := yamlcheck.Mapping(root, "the top level", topKeys)
	if err != nil {
		return nil, err
	}
	list := top[keyFederation]
	if list == nil {
		return &Config{}, nil
	}
	return parseList(list.Value, readFile)
}

// ParseConfigList is ParseConfig for the federation list alone, already
// parsed: the value of the federation key of a larger YAML file (the
// server's --config), whose line numbers its errors give.
func ParseConfigList(list *yaml.Node, readFile func(path string) ([]byte, error)) (*Config, error) {
	err := noAlias(list, keyFederation)
	var cfg *Config
	if err == nil {
		cfg, err = parseList(list, readFile)
	}
	if err != nil {
		return nil, fmt.Errorf("federation: %w", err)
	}
	return cfg, nil
}

// noAlias refuses aliases anywhere under n, whose path is where: they make
// the file harder to review, and nothing in this schema needs them.
func noAlias(n *yaml.Node, where string) error {
	found, path := yamlcheck.Find(n, where, yamlcheck.IsAlias)
	if found == nil {
		return nil
	}
	if path == "" {
		path = "the top level"
	}
	return yamlcheck.ErrorAt(found, "%s: YAML aliases are not supported", path)
}

// parseList reads the federation list, checked for aliases.
func parseList(list *yaml.Node, readFile func(string) ([]byte, error)) (*Config, error) {
	if list == nil || yamlcheck.IsNull(list) {
		return &Config{}, nil
	}
	if list.Kind != yaml.SequenceNode {
		return nil, yamlcheck.ErrorAt(list, "%s must be a list, got %s", keyFederation, yamlcheck.Describe(list))
	}
	p := configParser{readFile: readFile, seen: make(trustDomainSet)}
	cfg := &Config{}
	for i, item := range list.Content {
		ep, err := p.item(i, item)
		if err != nil {
			return nil, err
		}
		cfg.Endpoints = append(cfg.Endpoints, ep)
	}
	cfg.Warnings = p.warnings
	return cfg, nil
}

type configParser struct {
	readFile func(string) ([]byte, error)
	seen     trustDomainSet
	warnings []string
}

// Structural errors (unknown keys, wrong kinds) name the key by its path,
// "federation[1].refresh"; errors about a value name the item with its trust
// domain once that is known, "federation[1] (example.org): refresh.min".
func (p *configParser) item(i int, n *yaml.Node) (Endpoint, error) {
	path := fmt.Sprintf("%s[%d]", keyFederation, i)
	m, err := yamlcheck.Mapping(n, path, itemKeys)
	if err != nil {
		return Endpoint{}, err
	}
	for _, k := range []string{keyTrustDomain, keyBundleEndpointURL, keyBundleEndpointProfile} {
		if m[k] == nil {
			return Endpoint{}, yamlcheck.ErrorAt(n, "%s: missing required key %q", path, k)
		}
	}

	var ep Endpoint
	tdNode := m[keyTrustDomain].Value
	s, err := scalar(tdNode, path, keyTrustDomain)
	if err != nil {
		return Endpoint{}, err
	}
	if ep.TrustDomain, err = parseTrustDomain(s); err != nil {
		return Endpoint{}, yamlcheck.ErrorAt(tdNode, "%s: %s %q: %w", path, keyTrustDomain, s, err)
	}
	label := fmt.Sprintf("%s (%s)", path, ep.TrustDomain.Name())
	if err := p.seen.add(ep.TrustDomain, fmt.Sprintf("%s (line %d)", path, tdNode.Line)); err != nil {
		return Endpoint{}, yamlcheck.ErrorAt(tdNode, "%s: %w", label, err)
	}

	urlNode := m[keyBundleEndpointURL].Value
	if s, err = scalar(urlNode, path, keyBundleEndpointURL); err != nil {
		return Endpoint{}, err
	}
	if ep.URL, err = parseEndpointURL(s); err != nil {
		return Endpoint{}, yamlcheck.ErrorAt(urlNode, "%s: %s %q: %w", label, keyBundleEndpointURL, redact(s), err)
	}

	if err := profile(&ep, m[keyBundleEndpointProfile].Value, path, label); err != nil {
		return Endpoint{}, err
	}
	if r := m[keyRefresh]; r != nil {
		if ep.Refresh, err = refresh(r.Value, path, label); err != nil {
			return Endpoint{}, err
		}
	}
	if err := p.bootstrap(&ep, m, path, label); err != nil {
		return Endpoint{}, err
	}
	return ep, nil
}

func profile(ep *Endpoint, n *yaml.Node, path, label string) error {
	path += "." + keyBundleEndpointProfile
	m, err := yamlcheck.Mapping(n, path, profileKeys)
	if err != nil {
		return err
	}
	if m[keyType] == nil {
		return yamlcheck.ErrorAt(n, "%s: missing required key %q", path, keyType)
	}
	typeNode := m[keyType].Value
	s, err := scalar(typeNode, path, keyType)
	if err != nil {
		return err
	}
	ep.Profile = Profile(s)
	idKV := m[keyEndpointSPIFFEID]
	switch ep.Profile {
	case ProfileHTTPSWeb:
		if idKV != nil {
			return yamlcheck.ErrorAt(idKV.Key, "%s: %s: %s is only allowed with type %s", label, keyBundleEndpointProfile, keyEndpointSPIFFEID, ProfileHTTPSSPIFFE)
		}
	case ProfileHTTPSSPIFFE:
		if idKV == nil {
			return yamlcheck.ErrorAt(n, "%s: %s: type %s requires %s", label, keyBundleEndpointProfile, ProfileHTTPSSPIFFE, keyEndpointSPIFFEID)
		}
		if s, err = scalar(idKV.Value, path, keyEndpointSPIFFEID); err != nil {
			return err
		}
		if ep.EndpointSPIFFEID, err = parseEndpointSPIFFEID(s); err != nil {
			return yamlcheck.ErrorAt(idKV.Value, "%s: %s.%s %q: %w", label, keyBundleEndpointProfile, keyEndpointSPIFFEID, s, err)
		}
	default:
		return yamlcheck.ErrorAt(typeNode, "%s: %s.%s %q is not one of %s, %s", label, keyBundleEndpointProfile, keyType, s, ProfileHTTPSWeb, ProfileHTTPSSPIFFE)
	}
	return nil
}

func refresh(n *yaml.Node, path, label string) (Refresh, error) {
	path += "." + keyRefresh
	m, err := yamlcheck.Mapping(n, path, refreshKeys)
	if err != nil {
		return Refresh{}, err
	}
	var r Refresh
	for _, f := range []struct {
		key string
		dst *time.Duration
	}{{keyMin, &r.Min}, {keyMax, &r.Max}} {
		kv := m[f.key]
		if kv == nil {
			continue
		}
		s, err := scalar(kv.Value, path, f.key)
		if err != nil {
			return Refresh{}, err
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return Refresh{}, yamlcheck.ErrorAt(kv.Value, "%s: %s.%s: %w", label, keyRefresh, f.key, err)
		}
		// Zero in Refresh means "server default", so an explicit zero or
		// negative value cannot be represented and is refused.
		if d <= 0 {
			return Refresh{}, yamlcheck.ErrorAt(kv.Value, "%s: %s.%s %q must be positive", label, keyRefresh, f.key, s)
		}
		*f.dst = d
	}
	if err := checkRefresh(r); err != nil {
		return Refresh{}, yamlcheck.ErrorAt(n, "%s: %w", label, err)
	}
	return r, nil
}

func (p *configParser) bootstrap(ep *Endpoint, m map[string]*yamlcheck.Entry, path, label string) error {
	inline, file := m[keyTrustDomainBundle], m[keyTrustDomainBundleFile]
	var (
		d   bootstrapDoc
		err error
	)
	switch {
	case inline != nil && file != nil:
		second := inline
		if file.Key.Line > inline.Key.Line || (file.Key.Line == inline.Key.Line && file.Key.Column > inline.Key.Column) {
			second = file
		}
		return yamlcheck.ErrorAt(second.Key, "%s: %s and %s are mutually exclusive", label, keyTrustDomainBundle, keyTrustDomainBundleFile)
	case inline != nil:
		d, err = inlineBootstrap(inline, path, label)
	case file != nil:
		d, err = p.fileBootstrap(file, path, label)
	default:
		return nil
	}
	if err != nil {
		return err
	}
	if d.file != "" {
		ep.BootstrapBundleFile = d.file
	}
	warnings, err := setBootstrap(ep, d.doc)
	if err != nil {
		return yamlcheck.ErrorAt(d.at, "%s: %s: %w", label, d.source, err)
	}
	for _, w := range warnings {
		p.warnings = append(p.warnings, fmt.Sprintf("%s: %s: %s", label, d.source, w.String()))
	}
	return nil
}

// bootstrapDoc is a bootstrap bundle document as a federation entry gives
// it: where, for messages (source names the key, and the file), and the
// file's name when it came from one.
type bootstrapDoc struct {
	doc    []byte
	source string
	at     *yaml.Node
	file   string
}

// inlineBootstrap is the document of a trustDomainBundle entry.
func inlineBootstrap(inline *yamlcheck.Entry, path, label string) (bootstrapDoc, error) {
	s, err := scalar(inline.Value, path, keyTrustDomainBundle)
	if err != nil {
		return bootstrapDoc{}, err
	}
	if strings.TrimSpace(s) == "" {
		return bootstrapDoc{}, yamlcheck.ErrorAt(inline.Value, "%s: %s is empty", label, keyTrustDomainBundle)
	}
	return bootstrapDoc{doc: []byte(s), source: keyTrustDomainBundle, at: inline.Value}, nil
}

// fileBootstrap reads the document a trustDomainBundleFile entry names.
func (p *configParser) fileBootstrap(file *yamlcheck.Entry, path, label string) (bootstrapDoc, error) {
	name, err := scalar(file.Value, path, keyTrustDomainBundleFile)
	if err != nil {
		return bootstrapDoc{}, err
	}
	d := bootstrapDoc{source: fmt.Sprintf("%s %q", keyTrustDomainBundleFile, name), at: file.Value, file: name}
	if p.readFile == nil {
		return bootstrapDoc{}, yamlcheck.ErrorAt(d.at, "%s: %s not supported here", label, keyTrustDomainBundleFile)
	}
	if name == "" {
		return bootstrapDoc{}, yamlcheck.ErrorAt(d.at, "%s: %s is empty", label, keyTrustDomainBundleFile)
	}
	if d.doc, err = readBootstrapFile(name, p.readFile); err != nil {
		return bootstrapDoc{}, yamlcheck.ErrorAt(d.at, "%s: %s: %w", label, d.source, err)
	}
	return d, nil
}

// scalar returns the value of a string scalar. Other scalars are refused
// rather than stringified: "trustDomain: 1e3" is more likely a mistake than
// a trust domain, and quoting it is easy.
func scalar(n *yaml.Node, where, key string) (string, error) {
	if problem := yamlcheck.StringProblem(n); problem != "" {
		return "", yamlcheck.ErrorAt(n, "%s.%s %s", where, key, problem)
	}
	return n.Value, nil
}
