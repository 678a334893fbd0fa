#!/usr/bin/env bash
# Writes throwaway test certificates into DIR (created), valid for 2 days, EC P-256 keys:
#   ca.pem ca.key               the test CA
#   server.pem server.key       coordinator certificate (SAN 127.0.0.1, ::1, localhost), by ca
#   worker.pem worker.key       client certificate (CN adjsh-worker-1), by ca
#   worker2.pem worker2.key     client certificate (CN adjsh-worker-2), by ca
#   peer.pem peer.key           a worker's certificate for its peer endpoint too (SAN
#   peer2.pem peer2.key         DNS:adjsh-worker, server and client auth), by ca
#   other-ca.pem other-ca.key   another CA
#   rogue.pem rogue.key         client certificate by other-ca (refused in the TLS handshake)
#   rogue-server.pem/.key       coordinator certificate by other-ca (refused by clients)
#   server-encrypted.key        server.key encrypted with a passphrase (refused: never prompted)
#   token                       a 32-character job token
#   token-wrong                 another one
# Usage: make_test_certs.sh DIR
set -euo pipefail
dir=${1:?usage: make_test_certs.sh DIR}
mkdir -p "$dir"
cd "$dir"
ossl() { openssl "$@" 2>/dev/null; }
newkey() { ossl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }

ca() {  # ca NAME CN
  newkey "$1.key"
  ossl req -x509 -new -key "$1.key" -subj "/CN=$2" -days 2 -out "$1.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
}
leaf() {  # leaf NAME CN CA EXTENSIONS
  newkey "$1.key"
  ossl req -new -key "$1.key" -subj "/CN=$2" -out "$1.csr"
  printf '%s\n' "$4" > "$1.ext"
  ossl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -CAcreateserial -days 2 \
    -extfile "$1.ext" -out "$1.pem"
  rm -f "$1.csr" "$1.ext"
}

server_ext=$'subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE'
client_ext=$'extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE'
peer_ext=$'subjectAltName=DNS:adjsh-worker\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE'
ca ca adjsh-test-ca
ca other-ca adjsh-other-ca
leaf server localhost ca "$server_ext"
leaf worker adjsh-worker-1 ca "$client_ext"
leaf worker2 adjsh-worker-2 ca "$client_ext"
leaf peer adjsh-worker-peer-1 ca "$peer_ext"
leaf peer2 adjsh-worker-peer-2 ca "$peer_ext"
leaf rogue adjsh-rogue-worker other-ca "$client_ext"
leaf rogue-server localhost other-ca "$server_ext"
openssl pkey -in server.key -aes256 -passout pass:secret -out server-encrypted.key 2>/dev/null
printf 'adjsh-test-token-0123456789abcdef\n' > token
printf 'adjsh-wrong-token-fedcba987654321\n' > token-wrong
rm -f ./*.srl
