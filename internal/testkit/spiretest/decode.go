package spiretest

import (
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/trustbridge/trustbridge/internal/pemfile"
)

// SPIFFEValidatorName is the extension name of Envoy's SPIFFE certificate
// validator, in a validation context's custom_validator_config.
const SPIFFEValidatorName = "envoy.tls.cert_validator.spiffe"

// Kinds of Secret.
const (
	KindTLSCertificate    = "tls_certificate"
	KindValidationContext = "validation_context"
)

// SDSResponse is an SDS response decoded into plain values, so that two
// SDS servers' answers for the same caller can be compared field by field
// (assert.Equal on Secrets). Whatever differs between any two servers by
// nature (keys, serial numbers, validity, nonces) is left out of Secrets
// and kept in Raw.
type SDSResponse struct {
	TypeURL string
	// Secrets are the resources in the order served.
	Secrets []Secret
	// Raw is every resource as served, by name.
	Raw map[string]*tlsv3.Secret
}

// Secret is one SDS secret.
type Secret struct {
	Name string
	Kind string // KindTLSCertificate or KindValidationContext

	// TLSCertificate describes a tls_certificate.
	TLSCertificate *TLSCertificate `json:",omitempty"`
	// ValidationContext describes a validation_context.
	ValidationContext *ValidationContext `json:",omitempty"`
}

// TLSCertificate is a tls_certificate: an X509-SVID and its key.
type TLSCertificate struct {
	// URISANs are the leaf's URI SANs: an X509-SVID has exactly one.
	URISANs []string
	// ChainLength counts the certificates in certificate_chain.
	ChainLength int
	// KeyMatchesLeaf is whether private_key is the leaf's key.
	KeyMatchesLeaf bool
	// Sources are the DataSource kinds of certificate_chain and
	// private_key ("inline_bytes", "inline_string", "filename", ...).
	ChainSource, KeySource string
	// OtherFields names any other field set in the TlsCertificate.
	OtherFields []string `json:",omitempty"`
}

// ValidationContext is a validation_context: either roots in trusted_ca,
// or a custom validator (Envoy's SPIFFE validator: roots per trust domain).
type ValidationContext struct {
	// TrustedCA are the SHA-256s of the roots in trusted_ca.
	TrustedCA []string `json:",omitempty"`
	// Validator is custom_validator_config's name, ValidatorType its
	// typed_config's type URL.
	Validator, ValidatorType string
	// TrustDomains are the SPIFFE validator's trust_domains, as listed.
	TrustDomains []TrustDomainRoots `json:",omitempty"`
	// OtherFields names any other field set in the
	// CertificateValidationContext or SPIFFECertValidatorConfig (e.g.
	// match_typed_subject_alt_names, trust_bundles).
	OtherFields []string `json:",omitempty"`
}

// TrustDomainRoots is one trust domain of a SPIFFE validator.
type TrustDomainRoots struct {
	Name string
	// Source is the trust_bundle's DataSource kind.
	Source string
	// Roots are the SHA-256s of its X.509 roots, as listed.
	Roots []string
}

// Names are the resource names, in the order served.
func (r *SDSResponse) Names() []string {
	out := make([]string, 0, len(r.Secrets))
	for _, s := range r.Secrets {
		out = append(out, s.Name)
	}
	return out
}

// Secret is the decoded resource called name, or nil.
func (r *SDSResponse) Secret(name string) *Secret {
	for i := range r.Secrets {
		if r.Secrets[i].Name == name {
			return &r.Secrets[i]
		}
	}
	return nil
}

// DecodeSDS decodes an SDS response from any server.
func DecodeSDS(resp *discoveryv3.DiscoveryResponse) (*SDSResponse, error) {
	out := &SDSResponse{TypeURL: resp.GetTypeUrl(), Raw: make(map[string]*tlsv3.Secret)}
	for i, a := range resp.GetResources() {
		var s tlsv3.Secret
		if err := a.UnmarshalTo(&s); err != nil {
			return nil, fmt.Errorf("sds resource %d (%s): %w", i, a.GetTypeUrl(), err)
		}
		d, err := decodeSecret(&s)
		if err != nil {
			return nil, fmt.Errorf("sds secret %q: %w", s.GetName(), err)
		}
		out.Secrets = append(out.Secrets, d)
		out.Raw[s.GetName()] = &s
	}
	return out, nil
}

func decodeSecret(s *tlsv3.Secret) (Secret, error) {
	out := Secret{Name: s.GetName()}
	var err error
	switch t := s.GetType().(type) {
	case *tlsv3.Secret_TlsCertificate:
		out.Kind = KindTLSCertificate
		out.TLSCertificate, err = decodeTLSCertificate(t.TlsCertificate)
	case *tlsv3.Secret_ValidationContext:
		out.Kind = KindValidationContext
		out.ValidationContext, err = decodeValidationContext(t.ValidationContext)
	default:
		err = fmt.Errorf("type %T not decoded", t)
	}
	return out, err
}

func decodeTLSCertificate(c *tlsv3.TlsCertificate) (*TLSCertificate, error) {
	chainSource, chainPEM, err := dataSource(c.GetCertificateChain())
	if err != nil {
		return nil, fmt.Errorf("certificate_chain: %w", err)
	}
	keySource, keyPEM, err := dataSource(c.GetPrivateKey())
	if err != nil {
		return nil, fmt.Errorf("private_key: %w", err)
	}
	chain, err := pemfile.ParseCertificates(chainPEM)
	if err != nil {
		return nil, fmt.Errorf("certificate_chain: %w", err)
	}
	key, err := pemfile.ParsePrivateKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("private_key: %w", err)
	}
	out := &TLSCertificate{
		ChainLength: len(chain),
		ChainSource: chainSource,
		KeySource:   keySource,
		OtherFields: otherFields(c, "certificate_chain", "private_key"),
	}
	if len(chain) > 0 {
		for _, u := range chain[0].URIs {
			out.URISANs = append(out.URISANs, u.String())
		}
		pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
		out.KeyMatchesLeaf = ok && pub.Equal(chain[0].PublicKey)
	}
	return out, nil
}

func decodeValidationContext(vc *tlsv3.CertificateValidationContext) (*ValidationContext, error) {
	out := &ValidationContext{OtherFields: otherFields(vc, "trusted_ca", "custom_validator_config")}
	if vc.GetTrustedCa() != nil {
		roots, err := rootsOf(vc.GetTrustedCa())
		if err != nil {
			return nil, fmt.Errorf("trusted_ca: %w", err)
		}
		out.TrustedCA = roots
	}
	cv := vc.GetCustomValidatorConfig()
	if cv == nil {
		return out, nil
	}
	out.Validator, out.ValidatorType = cv.GetName(), cv.GetTypedConfig().GetTypeUrl()
	if out.Validator != SPIFFEValidatorName {
		return out, nil
	}
	var cfg tlsv3.SPIFFECertValidatorConfig
	if err := cv.GetTypedConfig().UnmarshalTo(&cfg); err != nil {
		return nil, fmt.Errorf("custom_validator_config: %w", err)
	}
	for _, o := range otherFields(&cfg, "trust_domains") {
		out.OtherFields = append(out.OtherFields, "custom_validator_config."+o)
	}
	for _, td := range cfg.GetTrustDomains() {
		source, _, _ := dataSource(td.GetTrustBundle())
		roots, err := rootsOf(td.GetTrustBundle())
		if err != nil {
			return nil, fmt.Errorf("trust domain %q: %w", td.GetName(), err)
		}
		out.TrustDomains = append(out.TrustDomains, TrustDomainRoots{Name: td.GetName(), Source: source, Roots: roots})
	}
	return out, nil
}

// dataSource returns an inline DataSource's kind and bytes; a file is
// named but not read.
func dataSource(ds *corev3.DataSource) (string, []byte, error) {
	switch s := ds.GetSpecifier().(type) {
	case *corev3.DataSource_InlineBytes:
		return "inline_bytes", s.InlineBytes, nil
	case *corev3.DataSource_InlineString:
		return "inline_string", []byte(s.InlineString), nil
	case nil:
		return "", nil, errors.New("empty data source")
	default:
		kind := "unknown"
		ds.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
			kind = string(fd.Name())
			return false
		})
		return kind, nil, fmt.Errorf("%s data source not read", kind)
	}
}

// rootsOf is the SHA-256 of each certificate in ds.
func rootsOf(ds *corev3.DataSource) ([]string, error) {
	_, data, err := dataSource(ds)
	if err != nil {
		return nil, err
	}
	certs, err := pemfile.ParseCertificates(data)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(certs))
	for _, c := range certs {
		out = append(out, RootSHA256(c))
	}
	return out, nil
}

// RootSHA256 is how a root appears in a decoded response: the hex
// SHA-256 of its DER.
func RootSHA256(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}

// otherFields names the fields set in m except those listed.
func otherFields(m proto.Message, except ...string) []string {
	var out []string
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		name := string(fd.Name())
		for _, e := range except {
			if e == name {
				return true
			}
		}
		out = append(out, name)
		return true
	})
	return out
}
