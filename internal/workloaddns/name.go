package workloaddns

import (
	"errors"
	"fmt"
	"strings"
)

// CheckLabel accepts one RFC 1123 label in lowercase: 1 to 63 of a-z, 0-9
// and '-', not starting or ending with '-'. Uppercase is refused, not
// folded: SPIFFE ID paths are case-sensitive, so "Web" and "web" are two
// workloads and must not get one name.
func CheckLabel(l string) error {
	switch {
	case l == "":
		return errors.New("empty label")
	case len(l) > MaxLabelLen:
		return fmt.Errorf("label of %d characters, at most %d", len(l), MaxLabelLen)
	case l[0] == '-' || l[len(l)-1] == '-':
		return errors.New("label starts or ends with '-'")
	}
	for i := 0; i < len(l); i++ {
		switch c := l[i]; {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-':
		case c == '.':
			return errors.New("holds '.', so it is more than one DNS label")
		default:
			return fmt.Errorf("character %q at offset %d; only a-z, 0-9 and '-' in a DNS label", c, i)
		}
	}
	return nil
}

// CheckName accepts a lowercase RFC 1123 host name: labels as CheckLabel,
// at most MaxNameLen characters, no trailing dot, and a last label that is
// not all digits (RFC 3696 §2: it would read as an IPv4 address). These
// are the rules the CA applies to every DNS name it signs.
func CheckName(name string) error {
	if len(name) > MaxNameLen {
		return fmt.Errorf("%d characters, at most %d", len(name), MaxNameLen)
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if err := CheckLabel(l); err != nil {
			return fmt.Errorf("label %q: %w", truncate(l, 64), err)
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return errors.New("last label is all digits, which reads as an IP address")
	}
	return nil
}
