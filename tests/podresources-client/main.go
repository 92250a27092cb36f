// Command podresources-client is a consumer of a kubelet's pod-resources API built on the client the Kubernetes
// project publishes (k8s.io/kubelet/pkg/apis/podresources/v1), as device-monitoring agents are. The real-node
// tests run it against node-agent's socket to show that a client generated from the upstream definition, not
// from this project's proto file, talks to node-agent unchanged.
//
// Usage:
//
//	podresources-client [-dial-path] SOCKET list
//	podresources-client [-dial-path] SOCKET allocatable
//	podresources-client [-dial-path] SOCKET get NAMESPACE NAME
//
// It names the socket by the unix scheme (so gRPC sends "localhost" as the request's authority); with -dial-path
// it dials the bare path with a dialer of its own, as the kubelet's own pod-resources client (GetV1Client in
// k8s.io/kubernetes/pkg/kubelet/apis/podresources) does, and gRPC sends the path as the authority.
//
// It prints the answer as JSON (proto field names) on stdout and exits 0; a gRPC error is printed as
// {"code": "...", "message": "..."} and the exit status is 3; bad usage or no connection exits 2.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"
)

func main() {
	dialPath := len(os.Args) > 1 && os.Args[1] == "-dial-path"
	if dialPath {
		os.Args = append(os.Args[:1], os.Args[2:]...)
	}
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: podresources-client [-dial-path] SOCKET list|allocatable|get NAMESPACE NAME")
		os.Exit(2)
	}
	target := "unix://" + os.Args[1]
	options := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if dialPath {
		// what grpc.DialContext does with a bare path: the passthrough resolver, the path as the address
		target = "passthrough:///" + os.Args[1]
		options = append(options, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
	}
	conn, err := grpc.NewClient(target, options...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "connecting:", err)
		os.Exit(2)
	}
	defer conn.Close()
	client := podresources.NewPodResourcesListerClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	var answer proto.Message
	switch {
	case os.Args[2] == "list" && len(os.Args) == 3:
		answer, err = client.List(ctx, &podresources.ListPodResourcesRequest{})
	case os.Args[2] == "allocatable" && len(os.Args) == 3:
		answer, err = client.GetAllocatableResources(ctx, &podresources.AllocatableResourcesRequest{})
	case os.Args[2] == "get" && len(os.Args) == 5:
		answer, err = client.Get(ctx, &podresources.GetPodResourcesRequest{PodNamespace: os.Args[3], PodName: os.Args[4]})
	default:
		fmt.Fprintln(os.Stderr, "usage: podresources-client [-dial-path] SOCKET list|allocatable|get NAMESPACE NAME")
		os.Exit(2)
	}
	if err != nil {
		s, _ := status.FromError(err)
		out, _ := json.Marshal(map[string]string{"code": s.Code().String(), "message": s.Message()})
		fmt.Println(string(out))
		os.Exit(3)
	}
	out, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(answer)
	if err != nil {
		fmt.Fprintln(os.Stderr, "encoding the answer:", err)
		os.Exit(2)
	}
	fmt.Println(string(out))
}
