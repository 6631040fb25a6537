package main

// `podnet-kube pki`: the keys and certificates of one user's control plane (docs/hpk.md),
// made with Go's own crypto/x509 in the job, as the user: a CA and a service-account key
// that persist in the state directory across restarts (HPK's resume: a kubeconfig and the
// tokens stay valid), and leaf certificates made anew on every start, since the control
// plane's pod address changes with its job.

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

type leaf struct {
	name   string // file name stem: <name>.crt, <name>.key
	cn     string
	org    []string
	usages []x509.ExtKeyUsage
	server bool // carries the control plane's addresses and names
}

var leaves = []leaf{
	{"apiserver", "kube-apiserver", nil, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, true},
	{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"},
		[]x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, false},
	{"admin", "kubernetes-admin", []string{"system:masters"}, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, false},
	{"controller-manager", "system:kube-controller-manager", nil,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, false},
	// the virtual kubelet binds pods and writes their status: the user's own cluster, whose
	// every part runs as the user, so it is an administrator of it
	{"kubelet", "podnet-kubelet", []string{"system:masters"}, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, false},
	{"kubelet-serving", "podnet-kubelet", nil, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, true},
}

func pkiMain(args []string) int {
	fl := flag.NewFlagSet("pki", flag.ContinueOnError)
	dir := fl.String("dir", "", "the directory of the keys and certificates (made 0700)")
	ips := fl.String("ip", "", "comma-separated addresses of the control plane (server certificates)")
	names := fl.String("dns", "", "comma-separated DNS names of the control plane (server certificates)")
	days := fl.Int("days", 365, "validity of the CA (made once) and of the leaf certificates, in days")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if *dir == "" || fl.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: podnet-kube pki --dir DIR [--ip A,B] [--dns N,M] [--days D]")
		return 2
	}
	if err := makePKI(*dir, split(*ips), split(*names), time.Duration(*days)*24*time.Hour); err != nil {
		fmt.Fprintf(os.Stderr, "podnet-kube pki: %v\n", err)
		return 1
	}
	return 0
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func makePKI(dir string, ips, names []string, validity time.Duration) error {
	var addrs []net.IP
	for _, s := range ips {
		ip := net.ParseIP(s)
		if ip == nil {
			return fmt.Errorf("--ip: %q is not an IP address", s)
		}
		addrs = append(addrs, ip)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	caKey, caCert, err := loadOrMakeCA(dir, validity)
	if err != nil {
		return err
	}
	if _, err := loadOrMakeKey(filepath.Join(dir, "sa.key")); err != nil {
		return err
	}
	if err := writePublic(filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")); err != nil {
		return err
	}
	now := time.Now()
	for _, l := range leaves {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{CommonName: l.cn, Organization: l.org},
			NotBefore:    now.Add(-5 * time.Minute),
			NotAfter:     now.Add(validity),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  l.usages,
		}
		if l.server {
			tmpl.IPAddresses = append([]net.IP{net.ParseIP("127.0.0.1")}, addrs...)
			tmpl.DNSNames = append([]string{"localhost", "kubernetes", "kubernetes.default",
				"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}, names...)
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, key.Public(), caKey)
		if err != nil {
			return fmt.Errorf("%s: %w", l.name, err)
		}
		if err := writeKey(filepath.Join(dir, l.name+".key"), key); err != nil {
			return err
		}
		if err := writePEM(filepath.Join(dir, l.name+".crt"), "CERTIFICATE", der); err != nil {
			return err
		}
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic(err)
	}
	return n
}

func loadOrMakeCA(dir string, validity time.Duration) (crypto.Signer, *x509.Certificate, error) {
	keyPath, crtPath := filepath.Join(dir, "ca.key"), filepath.Join(dir, "ca.crt")
	if b, err := os.ReadFile(crtPath); err == nil {
		key, err := loadOrMakeKey(keyPath)
		if err != nil {
			return nil, nil, err
		}
		blk, _ := pem.Decode(b)
		if blk == nil {
			return nil, nil, fmt.Errorf("%s: no PEM block", crtPath)
		}
		crt, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", crtPath, err)
		}
		// a CA that expires within a day is made anew (with everything it signed)
		if time.Until(crt.NotAfter) > 24*time.Hour {
			return key, crt, nil
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "podnet-hpk-ca"},
		NotBefore:             now.Add(-5 * time.Minute),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	if err := writeKey(keyPath, key); err != nil {
		return nil, nil, err
	}
	if err := writePEM(crtPath, "CERTIFICATE", der); err != nil {
		return nil, nil, err
	}
	crt, err := x509.ParseCertificate(der)
	return key, crt, err
}

func loadOrMakeKey(path string) (crypto.Signer, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		return key, writeKey(path, key)
	}
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("%s: no PEM block", path)
	}
	k, err := x509.ParseECPrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der)
}

func writePublic(keyPath, pubPath string) error {
	k, err := loadOrMakeKey(keyPath)
	if err != nil {
		return err
	}
	der, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		return err
	}
	return writePEM(pubPath, "PUBLIC KEY", der)
}

// writePEM writes one PEM block, 0600, through a temporary file renamed into place.
func writePEM(path, kind string, der []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".pki-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if err := pem.Encode(tmp, &pem.Block{Type: kind, Bytes: der}); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
