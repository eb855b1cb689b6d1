#!/bin/sh
# The AWS side of cluster.yaml, made once per cluster name and account with the AWS CLI (docs/cluster.md):
#   - the security group every node joins: SSH from your address only (Ray's own default group opens port 22
#     to 0.0.0.0/0), and any traffic between the group's members (Ray's ports, NCCL);
#   - two roles with instance profiles, least privilege, from the JSON files beside this script:
#       <cluster>-worker: node-storage-policy.json (the storage bucket read/write, the corpus bucket read-only,
#                         pulling the project image from ECR; nothing else)
#       <cluster>-head:   the same, plus head-autoscaler-policy.json (start, tag, stop and terminate only
#                         instances tagged ray-cluster-name=<cluster>, in the group above, handing them only
#                         the worker role): holding Ray's token no longer means holding the AWS account
#   - the ECR repository cocolm-ray with immutable tags (a pushed 0.1.0 can never change under the nodes).
# Ray then creates no role and no group of its own: cluster.yaml names both profiles and the group on every
# node type, and `python -m jobs.preflight cluster.yaml` refuses a node type without them.
#
#   STORAGE_BUCKET=my-checkpoints CORPUS_BUCKET=my-corpus SSH_CIDR=$(curl -s https://checkip.amazonaws.com)/32 \
#     sh platform/aws/setup.sh            # CLUSTER=cocolm REGION=us-west-2 VPC_ID=<the default VPC> by default
#
# Run it as someone allowed to create IAM roles and security groups (an administrator, once); `ray up` itself
# then needs only EC2 rights and iam:PassRole on the two roles. Re-running it updates the policies in place.
set -eu
: "${STORAGE_BUCKET:?the bucket of --storage s3://BUCKET/... (checkpoints)}"
: "${CORPUS_BUCKET:?the bucket of --corpus s3://BUCKET/... (the same as STORAGE_BUCKET if one bucket holds both)}"
: "${SSH_CIDR:?your address as a /32, e.g. SSH_CIDR=\$(curl -s https://checkip.amazonaws.com)/32}"
CLUSTER=${CLUSTER:-cocolm}     # cluster.yaml's cluster_name
REGION=${REGION:-us-west-2}    # cluster.yaml's provider.region
case "$SSH_CIDR" in 0.0.0.0/*|::/*) echo "error: SSH_CIDR=$SSH_CIDR opens SSH to everyone: give your own address (/32)" >&2; exit 1;; esac
here=$(cd "$(dirname "$0")" && pwd)
export AWS_REGION="$REGION"
ACCOUNT=$(aws sts get-caller-identity --query Account --output text)
VPC_ID=${VPC_ID:-$(aws ec2 describe-vpcs --filters Name=isDefault,Values=true --query 'Vpcs[0].VpcId' --output text)}

# The security group: found by name in the VPC, else created; its rules are added once (re-runs skip them).
SG_NAME="$CLUSTER-nodes"
SECURITY_GROUP_ID=$(aws ec2 describe-security-groups --filters Name=vpc-id,Values="$VPC_ID" Name=group-name,Values="$SG_NAME" \
  --query 'SecurityGroups[0].GroupId' --output text)
if [ "$SECURITY_GROUP_ID" = "None" ]; then
  SECURITY_GROUP_ID=$(aws ec2 create-security-group --group-name "$SG_NAME" --vpc-id "$VPC_ID" \
    --description "Ray cluster $CLUSTER: SSH from one address, all traffic within the group" \
    --tag-specifications "ResourceType=security-group,Tags=[{Key=ray-cluster-name,Value=$CLUSTER}]" --query GroupId --output text)
  aws ec2 authorize-security-group-ingress --group-id "$SECURITY_GROUP_ID" --protocol tcp --port 22 --cidr "$SSH_CIDR" >/dev/null
  aws ec2 authorize-security-group-ingress --group-id "$SECURITY_GROUP_ID" --protocol -1 --source-group "$SECURITY_GROUP_ID" >/dev/null
fi

# The policies, with this account's names filled in; a placeholder left unfilled stops the script.
render() {
  sed -e "s|\${STORAGE_BUCKET}|$STORAGE_BUCKET|g" -e "s|\${CORPUS_BUCKET}|$CORPUS_BUCKET|g" -e "s|\${CLUSTER}|$CLUSTER|g" \
      -e "s|\${REGION}|$REGION|g" -e "s|\${ACCOUNT}|$ACCOUNT|g" -e "s|\${SECURITY_GROUP_ID}|$SECURITY_GROUP_ID|g" "$here/$1"
}
for f in node-storage-policy.json head-autoscaler-policy.json; do
  if render "$f" | grep -q '\${'; then echo "error: $f: a placeholder is left unfilled" >&2; exit 1; fi
done

role() {  # role NAME POLICY...: the role, its inline policies and its instance profile of the same name
  name=$1; shift
  aws iam get-role --role-name "$name" >/dev/null 2>&1 \
    || aws iam create-role --role-name "$name" --assume-role-policy-document "file://$here/trust-ec2.json" >/dev/null
  for policy in "$@"; do
    aws iam put-role-policy --role-name "$name" --policy-name "${policy%.json}" --policy-document "$(render "$policy")"
  done
  if ! aws iam get-instance-profile --instance-profile-name "$name" >/dev/null 2>&1; then
    aws iam create-instance-profile --instance-profile-name "$name" >/dev/null
    aws iam add-role-to-instance-profile --instance-profile-name "$name" --role-name "$name"
  fi
}
role "$CLUSTER-worker" node-storage-policy.json
role "$CLUSTER-head" node-storage-policy.json head-autoscaler-policy.json

aws ecr describe-repositories --repository-names cocolm-ray >/dev/null 2>&1 \
  || aws ecr create-repository --repository-name cocolm-ray --image-tag-mutability IMMUTABLE >/dev/null

cat <<DONE
Made for cluster $CLUSTER in $REGION (account $ACCOUNT). In cluster.yaml:
  every node type's node_config: SecurityGroupIds: [$SECURITY_GROUP_ID]
  head:       IamInstanceProfile: {Name: $CLUSTER-head}      (already so for cluster_name: cocolm)
  gpu_worker: IamInstanceProfile: {Name: $CLUSTER-worker}
  docker.image: $ACCOUNT.dkr.ecr.$REGION.amazonaws.com/cocolm-ray:<pyproject version>
Then: python -m jobs.preflight --strict cluster.yaml --storage s3://$STORAGE_BUCKET/...
DONE
