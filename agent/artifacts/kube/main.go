// Command podnet-kube is the Kubernetes control plane of podnet's HPK (docs/hpk.md): the
// upstream kube-apiserver, kube-controller-manager and kubectl commands of one Kubernetes
// release in one binary, chosen by the name it is called by (kube-apiserver,
// kube-controller-manager, kubectl: links to it) or by its first argument
// (`podnet-kube apiserver ...`), and `podnet-kube pki`, the control plane's keys and
// certificates (pki.go). One binary shares the ~2,000 packages the commands have in
// common: one build, one artifact, one checksum. Nothing here changes what the commands do.
//
// Build it with agent/artifacts/build-artifacts.sh (cached by its inputs).
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	kubectl "k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

var commands = map[string]func() *cobra.Command{
	"apiserver":          apiserver.NewAPIServerCommand,
	"controller-manager": controllermanager.NewControllerManagerCommand,
	"kubectl":            kubectl.NewDefaultKubectlCommand,
}

// command returns the command's name and its arguments: from argv[0] when the binary is
// called through a link (kube-apiserver, kubectl, ...), else from the first argument.
func command(args []string) (string, []string) {
	name := strings.TrimPrefix(filepath.Base(args[0]), "kube-")
	if _, ok := commands[name]; ok {
		return name, args[1:]
	}
	if len(args) > 1 {
		return strings.TrimPrefix(args[1], "kube-"), args[2:]
	}
	return "", nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "pki" {
		os.Exit(pkiMain(os.Args[2:]))
	}
	name, args := command(os.Args)
	build, ok := commands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "usage: podnet-kube {apiserver|controller-manager|kubectl|pki} [ARGS...]\n"+
			"       (or call it through a link named kube-apiserver, kube-controller-manager, kubectl)\n")
		os.Exit(2)
	}
	cmd := build()
	cmd.SetArgs(args)
	if name == "kubectl" {
		if err := cli.RunNoErrOutput(cmd); err != nil {
			util.CheckErr(err)
		}
		return
	}
	os.Exit(cli.Run(cmd))
}
