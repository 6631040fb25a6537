# SPDX-License-Identifier: Apache-2.0
"""HPK on podnet (docs/hpk.md): a user's own Kubernetes in Slurm jobs. `podnet-hpk up`
submits the control plane (etcd, kube-apiserver, kube-controller-manager, CoreDNS and
podnet's virtual kubelet) as one of the user's jobs; the kubelet turns every Kubernetes
pod into one Slurm job of that user, whose podnet pod is the Kubernetes pod's network.

Modules, by layer (each imports only those above it in this list):
  settings, quantity   the site's HPK settings; Kubernetes quantities
  podplan              a pod's plan: its types, PodSpecError, the values only its job knows
  podspec              a Kubernetes pod -> the Slurm job and Apptainer commands that run it
  runner               in the pod's job: runs the containers, writes their status
  slurm, kubeapi       Slurm's commands; Kubernetes' REST API
  kubenode, servicedns the virtual node's Node object and Lease; the Service names' zone
  kubelet, logserver   the virtual node: its pods, `kubectl logs`
  controlplane, cli    the control plane's supervisor in its job; `podnet-hpk`
"""
